package stalwart

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
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
	spec.NumSlots = 1 // the test cluster has one trainer, and the next test needs it
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

// A user's whole path from Go: submit a job leaving the optional fields to the
// coordinator's defaults, follow it to the end, pull its final weights (every
// CRC32C checked) and write them as JSON to STALWART_WEIGHTS_OUT, which the
// calling pytest compares bitwise with the Python client's pull.
func TestSubmitFollowPull(t *testing.T) {
	c := NewCoordinator([]string{backend(t, "STALWART_COORDINATOR")}, Options{})
	defer c.Close()
	out := backend(t, "STALWART_WEIGHTS_OUT")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	spec := &pb.JobSpec{Model: "mlp", Steps: 5, Seed: 11}
	job, err := c.SubmitJob(ctx, "", fmt.Sprintf("go-pull-%d", time.Now().UnixNano()), spec)
	if err != nil {
		t.Fatalf("SubmitJob: %v", err)
	}
	if job.GetSpec().GetBatchSize() == 0 || job.GetSpec().GetOptimizer().GetLr() == 0 {
		t.Fatalf("the coordinator filled in no defaults: %v", job.GetSpec())
	}
	done, err := c.WaitJob(ctx, job.GetJobId(), 500*time.Millisecond)
	if err != nil {
		t.Fatalf("WaitJob: %v", err)
	}
	if done.GetState() != pb.JobState_JOB_STATE_SUCCEEDED || done.GetStep() != 5 {
		t.Fatalf("job ended %v at step %d: %s", done.GetState(), done.GetStep(), done.GetReason())
	}
	weights, err := c.PullWeights(ctx, job.GetJobId())
	if err != nil {
		t.Fatalf("PullWeights: %v", err)
	}
	if err := writeWeights(out, job.GetJobId(), weights); err != nil {
		t.Fatal(err)
	}
	t.Logf("pulled %d tensors of job %s", len(weights), job.GetJobId())
}

func writeWeights(path, jobID string, weights map[string]Tensor) error {
	type entry struct {
		Name  string  `json:"name"`
		Dtype string  `json:"dtype"`
		Shape []int64 `json:"shape"`
		Data  []byte  `json:"data"` // base64 in JSON
	}
	dump := struct {
		JobID   string  `json:"job_id"`
		Tensors []entry `json:"tensors"`
	}{JobID: jobID}
	for name, t := range weights {
		dump.Tensors = append(dump.Tensors, entry{name, t.Spec.GetDtype().String(), t.Spec.GetShape(), t.Data})
	}
	raw, err := json.Marshal(dump)
	if err != nil {
		return err
	}
	return os.WriteFile(path, raw, 0o644)
}
