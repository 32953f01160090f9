package stalwart

import (
	"context"
	"fmt"
	"io"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/stalwart-ml/stalwart/clients/go/stalwartv1"
)

// The wire contract from Go alone, against a live paramserver primary:
// register a model, push a gradient as CRC32C chunks, pull the result, and
// see a retried push answered duplicate and a corrupt chunk refused unapplied.
func TestParamServerPushPullRoundTrip(t *testing.T) {
	conn, err := Dial(backend(t, "STALWART_PARAMSERVER"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ps := pb.NewParamServerServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	st, err := ps.GetReplicaStatus(ctx, &pb.GetReplicaStatusRequest{})
	if err != nil {
		t.Fatalf("GetReplicaStatus: %v", err)
	}
	if st.GetRole() != pb.ReplicaRole_REPLICA_ROLE_PRIMARY {
		t.Fatalf("want a primary, got %v", st.GetRole())
	}
	epoch := st.GetEpoch()
	job := fmt.Sprintf("go-%d", time.Now().UnixNano())
	specs := []*pb.TensorSpec{{Name: "w", Dtype: pb.Dtype_DTYPE_FLOAT32, Shape: []int64{3}}}
	// Values and learning rate chosen so float32 SGD is exact: w - 0.5*g.
	initial := []float32{1, 2, 3}
	grad := []float32{0.5, 1, -2}
	want := []float32{0.75, 1.5, 4}

	reg, err := ps.RegisterModel(ctx)
	if err != nil {
		t.Fatal(err)
	}
	send(t, reg.Send, &pb.RegisterModelRequest{Part: &pb.RegisterModelRequest_Header{Header: &pb.ModelHeader{
		JobId:       job,
		Optimizer:   &pb.OptimizerSpec{Kind: pb.OptimizerKind_OPTIMIZER_KIND_SGD, Lr: 0.5},
		Consistency: &pb.ConsistencySpec{Mode: pb.ConsistencyMode_CONSISTENCY_MODE_SYNC},
		NumSlots:    1,
		Epoch:       epoch,
		Tensors:     specs,
	}}})
	// 4-byte chunks: one per element, so the stream really is chunked.
	for _, c := range Chunks(0, Float32Bytes(initial), 4) {
		send(t, reg.Send, &pb.RegisterModelRequest{Part: &pb.RegisterModelRequest_Chunk{Chunk: c}})
	}
	if r, err := reg.CloseAndRecv(); err != nil || r.GetVersion() != 0 {
		t.Fatalf("RegisterModel: %v, %v", r, err)
	}

	resp, err := push(ctx, ps, job, 0, epoch, specs, Chunks(0, Float32Bytes(grad), 4))
	if err != nil || resp.GetVersion() != 1 || resp.GetDuplicate() {
		t.Fatalf("Push: %v, %v", resp, err)
	}
	resp, err = push(ctx, ps, job, 0, epoch, specs, Chunks(0, Float32Bytes(grad), 4))
	if err != nil || !resp.GetDuplicate() || resp.GetVersion() != 1 {
		t.Fatalf("retried Push must be a duplicate at version 1: %v, %v", resp, err)
	}

	version, got := pull(ctx, t, ps, job, epoch)
	if version != 1 || !slices.Equal(got, want) {
		t.Fatalf("Pull: version %d values %v, want 1 %v", version, got, want)
	}

	bad := Chunks(0, Float32Bytes(grad), 4)
	bad[1].Crc32C ^= 1
	_, err = push(ctx, ps, job, 1, epoch, specs, bad)
	if status.Code(err) != codes.DataLoss {
		t.Fatalf("corrupt chunk: want DATA_LOSS, got %v", err)
	}
	if version, got = pull(ctx, t, ps, job, epoch); version != 1 || !slices.Equal(got, want) {
		t.Fatalf("after a corrupt push: version %d values %v, want nothing applied", version, got)
	}
}

func send[M any](t *testing.T, fn func(M) error, m M) {
	t.Helper()
	if err := fn(m); err != nil && err != io.EOF {
		t.Fatalf("send: %v", err)
	}
}

func push(ctx context.Context, ps pb.ParamServerServiceClient, job string, step, epoch int64,
	specs []*pb.TensorSpec, chunks []*pb.TensorChunk) (*pb.PushResponse, error) {
	stream, err := ps.Push(ctx)
	if err != nil {
		return nil, err
	}
	header := &pb.PushHeader{JobId: job, Step: step, Slot: 0, BaseVersion: step, Epoch: epoch, Tensors: specs}
	// A send error means the server already answered: CloseAndRecv returns it.
	if stream.Send(&pb.PushRequest{Part: &pb.PushRequest_Header{Header: header}}) == nil {
		for _, c := range chunks {
			if stream.Send(&pb.PushRequest{Part: &pb.PushRequest_Chunk{Chunk: c}}) != nil {
				break
			}
		}
	}
	return stream.CloseAndRecv()
}

func pull(ctx context.Context, t *testing.T, ps pb.ParamServerServiceClient, job string, epoch int64) (int64, []float32) {
	t.Helper()
	stream, err := ps.Pull(ctx, &pb.PullRequest{JobId: job, SinceVersion: -1, MinVersion: 0, Epoch: epoch})
	if err != nil {
		t.Fatal(err)
	}
	var header *pb.PullHeader
	var asm *Assembler
	for {
		msg, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("Pull: %v", err)
		}
		if h := msg.GetHeader(); h != nil {
			header, asm = h, NewAssembler(h.GetTensors())
			continue
		}
		if asm == nil {
			t.Fatal("Pull: chunk before header")
		}
		if err := asm.Add(msg.GetChunk()); err != nil {
			t.Fatalf("Pull: %v", err)
		}
	}
	if header == nil || len(header.GetTensors()) != 1 || header.GetTensors()[0].GetName() != "w" {
		t.Fatalf("Pull header: %v", header)
	}
	values, err := BytesFloat32(asm.Bytes(0))
	if err != nil {
		t.Fatal(err)
	}
	return header.GetVersion(), values
}
