package stalwart

import (
	"context"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/stalwart-ml/stalwart/clients/go/stalwartv1"
)

// Coordinator calls whichever coordinator replica leads: a standby answers
// FAILED_PRECONDITION with reason NOT_LEADER and the leader's address in the
// ErrorInfo metadata "leader", and the call is sent there instead.
type Coordinator struct {
	addresses []string
	opts      Options
	conns     map[string]*grpc.ClientConn
	leader    string
}

// NewCoordinator takes the replicas' addresses (a comma-separated list works too).
func NewCoordinator(addresses []string, opts Options) *Coordinator {
	var list []string
	for _, a := range addresses {
		for _, part := range strings.Split(a, ",") {
			if p := strings.TrimSpace(part); p != "" {
				list = append(list, p)
			}
		}
	}
	return &Coordinator{addresses: list, opts: opts, conns: map[string]*grpc.ClientConn{}}
}

// Close closes every connection.
func (c *Coordinator) Close() {
	for _, conn := range c.conns {
		conn.Close()
	}
}

func (c *Coordinator) stub(address string) (pb.CoordinatorServiceClient, error) {
	conn, ok := c.conns[address]
	if !ok {
		var err error
		if conn, err = Dial(address, c.opts); err != nil {
			return nil, err
		}
		c.conns[address] = conn
	}
	return pb.NewCoordinatorServiceClient(conn), nil
}

// call runs fn against the known leader first, then every replica, following
// NOT_LEADER hints. Other errors are returned as they are.
func call[T any](ctx context.Context, c *Coordinator, fn func(pb.CoordinatorServiceClient) (T, error)) (T, error) {
	var zero T
	tried := map[string]bool{}
	queue := append([]string{c.leader}, c.addresses...)
	var lastErr error = ErrNoLeader
	for len(queue) > 0 {
		address := queue[0]
		queue = queue[1:]
		if address == "" || tried[address] {
			continue
		}
		tried[address] = true
		stub, err := c.stub(address)
		if err != nil {
			return zero, err
		}
		out, err := fn(stub)
		if err == nil {
			c.leader = address
			return out, nil
		}
		lastErr = err
		reason, meta := Reason(err)
		code := status.Code(err)
		switch {
		case reason == "NOT_LEADER":
			queue = append([]string{meta["leader"]}, queue...)
		case code == codes.Unavailable:
			// that replica is down: try the next
		default:
			return zero, err
		}
	}
	return zero, lastErr
}

// ListNodes returns every registered node, all pages.
func (c *Coordinator) ListNodes(ctx context.Context) ([]*pb.Node, error) {
	var nodes []*pb.Node
	token := ""
	for {
		resp, err := call(ctx, c, func(s pb.CoordinatorServiceClient) (*pb.ListNodesResponse, error) {
			return s.ListNodes(ctx, &pb.ListNodesRequest{PageSize: 100, PageToken: token})
		})
		if err != nil {
			return nil, err
		}
		nodes = append(nodes, resp.GetNodes()...)
		if token = resp.GetNextPageToken(); token == "" {
			return nodes, nil
		}
	}
}

// ListJobs returns every job, newest first, all pages.
func (c *Coordinator) ListJobs(ctx context.Context) ([]*pb.Job, error) {
	var jobs []*pb.Job
	token := ""
	for {
		resp, err := call(ctx, c, func(s pb.CoordinatorServiceClient) (*pb.ListJobsResponse, error) {
			return s.ListJobs(ctx, &pb.ListJobsRequest{PageSize: 100, PageToken: token})
		})
		if err != nil {
			return nil, err
		}
		jobs = append(jobs, resp.GetJobs()...)
		if token = resp.GetNextPageToken(); token == "" {
			return jobs, nil
		}
	}
}

// SubmitJob admits a job. requestID makes a retry return the same job.
func (c *Coordinator) SubmitJob(ctx context.Context, jobID, requestID string, spec *pb.JobSpec) (*pb.Job, error) {
	resp, err := call(ctx, c, func(s pb.CoordinatorServiceClient) (*pb.CreateJobResponse, error) {
		return s.CreateJob(ctx, &pb.CreateJobRequest{JobId: jobID, Spec: spec, RequestId: requestID})
	})
	if err != nil {
		return nil, err
	}
	return resp.GetJob(), nil
}

// GetJob returns one job.
func (c *Coordinator) GetJob(ctx context.Context, jobID string) (*pb.Job, error) {
	resp, err := call(ctx, c, func(s pb.CoordinatorServiceClient) (*pb.GetJobResponse, error) {
		return s.GetJob(ctx, &pb.GetJobRequest{JobId: jobID})
	})
	if err != nil {
		return nil, err
	}
	return resp.GetJob(), nil
}

// DefaultSpec is a small synchronous job on a built-in model: what the example
// program submits when given no flags.
func DefaultSpec() *pb.JobSpec {
	return &pb.JobSpec{
		Model:       "mlp",
		Optimizer:   &pb.OptimizerSpec{Kind: pb.OptimizerKind_OPTIMIZER_KIND_SGD, Lr: 0.05},
		Consistency: &pb.ConsistencySpec{Mode: pb.ConsistencyMode_CONSISTENCY_MODE_SYNC},
		NumSlots:    2,
		Steps:       20,
		Seed:        1,
		BatchSize:   32,
	}
}
