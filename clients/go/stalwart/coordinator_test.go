package stalwart

import (
	"context"
	"fmt"
	"testing"
	"time"

	pb "github.com/stalwart-ml/stalwart/clients/go/stalwartv1"
)

// What stalwartctl does, against a live coordinator: list nodes and jobs,
// submit a job, and find it listed.
func TestCoordinatorListAndSubmit(t *testing.T) {
	c := NewCoordinator([]string{backend(t, "STALWART_COORDINATOR")}, Options{})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	if _, err := c.ListNodes(ctx); err != nil {
		t.Fatalf("ListNodes: %v", err)
	}
	if _, err := c.ListJobs(ctx); err != nil {
		t.Fatalf("ListJobs: %v", err)
	}
	requestID := fmt.Sprintf("go-test-%d", time.Now().UnixNano())
	spec := DefaultSpec()
	spec.Steps = 1
	job, err := c.SubmitJob(ctx, "", requestID, spec)
	if err != nil {
		t.Fatalf("SubmitJob: %v", err)
	}
	if job.GetJobId() == "" || job.GetSpec().GetModel() != spec.Model {
		t.Fatalf("SubmitJob returned %v", job)
	}
	again, err := c.SubmitJob(ctx, "", requestID, spec) // same request id: same job
	if err != nil || again.GetJobId() != job.GetJobId() {
		t.Fatalf("retried SubmitJob: %v, %v (want job %s)", again, err, job.GetJobId())
	}
	jobs, err := c.ListJobs(ctx)
	if err != nil {
		t.Fatalf("ListJobs: %v", err)
	}
	for _, j := range jobs {
		if j.GetJobId() == job.GetJobId() {
			if j.GetState() == pb.JobState_JOB_STATE_UNSPECIFIED {
				t.Fatalf("job %s has no state", j.GetJobId())
			}
			return
		}
	}
	t.Fatalf("job %s not in ListJobs", job.GetJobId())
}
