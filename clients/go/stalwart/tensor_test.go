package stalwart

import (
	"encoding/binary"
	"math"
	"slices"
	"testing"

	pb "github.com/stalwart-ml/stalwart/clients/go/stalwartv1"
)

// CRC32C check values from RFC 3720 (iSCSI), the same polynomial the Python
// side computes with google-crc32c.
func TestCRC32CKnownValues(t *testing.T) {
	if got := CRC32C([]byte("123456789")); got != 0xE3069283 {
		t.Fatalf("CRC32C(123456789) = %#x", got)
	}
	if got := CRC32C(make([]byte, 32)); got != 0x8A9136AA {
		t.Fatalf("CRC32C(32 zero bytes) = %#x", got)
	}
}

func TestChunksReassemble(t *testing.T) {
	values := []float32{1.5, -2, 3.25, 0, 7, 8, 9}
	data := Float32Bytes(values)
	chunks := Chunks(0, data, 8)
	if len(chunks) != 4 {
		t.Fatalf("%d chunks, want 4", len(chunks))
	}
	asm := NewAssembler([]*pb.TensorSpec{{Name: "x"}})
	for _, c := range chunks {
		if err := asm.Add(c); err != nil {
			t.Fatal(err)
		}
	}
	got, err := BytesFloat32(asm.Bytes(0))
	if err != nil || !slices.Equal(got, values) {
		t.Fatalf("got %v, %v", got, err)
	}
	bad := Chunks(0, data, 8)
	bad[0].Data = append([]byte{}, bad[0].Data...)
	bad[0].Data[0] ^= 0xFF
	if err := NewAssembler([]*pb.TensorSpec{{Name: "x"}}).Add(bad[0]); err == nil {
		t.Fatal("a corrupted chunk was accepted")
	}
}

func TestBFloat16BytesRoundsAsTorchDoes(t *testing.T) {
	// expected halves from torch: tensor(values).to(torch.bfloat16)
	values := []float32{1.0, -2.5, 1.00390625, 1.01171875, math.MaxFloat32, 1e-40, 0.1, float32(math.Copysign(0, -1))}
	want := []uint16{0x3f80, 0xc020, 0x3f80, 0x3f82, 0x7f80, 0x0001, 0x3dcd, 0x8000}
	got := BFloat16Bytes(values)
	if len(got) != 2*len(values) {
		t.Fatalf("got %d bytes for %d values", len(got), len(values))
	}
	for i, w := range want {
		if h := binary.LittleEndian.Uint16(got[2*i:]); h != w {
			t.Errorf("value %v: got %#04x, want %#04x", values[i], h, w)
		}
	}
	nan := binary.LittleEndian.Uint16(BFloat16Bytes([]float32{float32(math.NaN())}))
	if nan&0x7f80 != 0x7f80 || nan&0x007f == 0 {
		t.Errorf("NaN encoded as %#04x, not a NaN", nan)
	}
}
