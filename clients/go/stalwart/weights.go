package stalwart

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/stalwart-ml/stalwart/clients/go/stalwartv1"
)

// Tensor is one tensor's spec and its raw little-endian bytes.
type Tensor struct {
	Spec *pb.TensorSpec
	Data []byte
}

// Pull streams a job's parameters from one replica: a header, then chunks,
// every chunk's CRC32C checked. req.Epoch must be the group's epoch
// (ShardGroup.Epoch from GetShardMap); any other is refused.
func Pull(ctx context.Context, ps pb.ParamServerServiceClient, req *pb.PullRequest) (int64, []Tensor, error) {
	stream, err := ps.Pull(ctx, req)
	if err != nil {
		return 0, nil, err
	}
	var header *pb.PullHeader
	var asm *Assembler
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return 0, nil, err
		}
		if h := msg.GetHeader(); h != nil {
			header, asm = h, NewAssembler(h.GetTensors())
			continue
		}
		if asm == nil {
			return 0, nil, errors.New("pull stream sent a chunk before its header")
		}
		if err := asm.Add(msg.GetChunk()); err != nil {
			return 0, nil, err
		}
	}
	if header == nil {
		return 0, nil, errors.New("pull stream was empty")
	}
	out := make([]Tensor, len(header.GetTensors()))
	for i, spec := range header.GetTensors() {
		out[i] = Tensor{Spec: spec, Data: asm.Bytes(i)}
	}
	return header.GetVersion(), out, nil
}

// JoinPieces rebuilds whole tensors from shard pieces: a row range is a
// contiguous run of dimension 0's bytes, so a split tensor is its pieces'
// bytes in row order.
func JoinPieces(pieces []*pb.ShardPiece, byPiece map[string]Tensor) (map[string]Tensor, error) {
	byTensor := map[string][]*pb.ShardPiece{}
	for _, p := range pieces {
		byTensor[p.GetTensorName()] = append(byTensor[p.GetTensorName()], p)
	}
	out := map[string]Tensor{}
	for name, parts := range byTensor {
		sort.Slice(parts, func(i, j int) bool { return parts[i].GetRowStart() < parts[j].GetRowStart() })
		var data []byte
		var rows int64
		var first *pb.TensorSpec
		for _, p := range parts {
			t, ok := byPiece[p.GetPieceName()]
			if !ok {
				return nil, fmt.Errorf("shard %d sent no piece %s", p.GetShard(), p.GetPieceName())
			}
			if first == nil {
				first = t.Spec
			}
			if len(t.Spec.GetShape()) > 0 {
				rows += t.Spec.GetShape()[0]
			}
			data = append(data, t.Data...)
		}
		shape := first.GetShape()
		if len(parts) > 1 {
			shape = append([]int64{rows}, shape[1:]...)
		}
		out[name] = Tensor{Spec: &pb.TensorSpec{Name: name, Dtype: first.GetDtype(), Shape: shape}, Data: data}
	}
	return out, nil
}

// PullWeights returns a job's current parameters, whole, from every shard
// group's primary, as the shard map places them.
func (c *Coordinator) PullWeights(ctx context.Context, jobID string) (map[string]Tensor, error) {
	shardMap, err := c.GetShardMap(ctx, jobID)
	if err != nil {
		return nil, err
	}
	pieces := shardMap.GetShardMap().GetPieces()
	if len(pieces) == 0 {
		return nil, fmt.Errorf("job %s: the shard map has no pieces yet (model not registered)", jobID)
	}
	byPiece := map[string]Tensor{}
	for _, g := range shardMap.GetGroups() {
		conn, err := Dial(g.GetPrimaryAddress(), c.opts)
		if err != nil {
			return nil, err
		}
		_, tensors, err := Pull(ctx, pb.NewParamServerServiceClient(conn),
			&pb.PullRequest{JobId: jobID, SinceVersion: -1, Epoch: g.GetEpoch()})
		conn.Close()
		if err != nil {
			return nil, fmt.Errorf("shard %d: %w", g.GetShard(), err)
		}
		for _, t := range tensors {
			byPiece[t.Spec.GetName()] = t
		}
	}
	return JoinPieces(pieces, byPiece)
}

// GetShardMap returns where a job's parameters live, pieces included.
func (c *Coordinator) GetShardMap(ctx context.Context, jobID string) (*pb.GetShardMapResponse, error) {
	return call(ctx, c, func(s pb.CoordinatorServiceClient) (*pb.GetShardMapResponse, error) {
		return s.GetShardMap(ctx, &pb.GetShardMapRequest{JobId: jobID})
	})
}

// WaitJob polls a job every interval until it finishes or ctx ends. While the
// coordinators elect a leader (NOT_LEADER with no leader named, UNAVAILABLE)
// it keeps polling; any other error ends the wait.
func (c *Coordinator) WaitJob(ctx context.Context, jobID string, interval time.Duration) (*pb.Job, error) {
	for {
		job, err := c.GetJob(ctx, jobID)
		if err != nil && !transient(err) {
			return nil, err
		}
		switch job.GetState() {
		case pb.JobState_JOB_STATE_SUCCEEDED, pb.JobState_JOB_STATE_FAILED, pb.JobState_JOB_STATE_CANCELLED:
			return job, nil
		}
		select {
		case <-ctx.Done():
			return job, fmt.Errorf("job %s not finished: %w (last error: %v)", jobID, ctx.Err(), err)
		case <-time.After(interval):
		}
	}
}

// transient: worth the same call again shortly (no leader yet, replica down).
func transient(err error) bool {
	reason, _ := Reason(err)
	return reason == "NOT_LEADER" || errors.Is(err, ErrNoLeader) || status.Code(err) == codes.Unavailable
}
