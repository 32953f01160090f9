package stalwart

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"

	pb "github.com/stalwart-ml/stalwart/clients/go/stalwartv1"
)

// castagnoli is CRC32C, the checksum every TensorChunk carries.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// CRC32C of data, as the wire contract defines it.
func CRC32C(data []byte) uint32 { return crc32.Checksum(data, castagnoli) }

// Float32Bytes encodes values as little-endian IEEE 754, the wire's byte order.
func Float32Bytes(values []float32) []byte {
	out := make([]byte, 4*len(values))
	for i, v := range values {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(v))
	}
	return out
}

// BFloat16Bytes encodes float32 values as little-endian bfloat16, each rounded to
// nearest with ties to even, as torch rounds them: what a job with gradient_dtype
// DTYPE_BFLOAT16 expects a float32 parameter's gradient in (docs/models.md,
// "Gradients on the wire"). A NaN stays a NaN.
func BFloat16Bytes(values []float32) []byte {
	out := make([]byte, 2*len(values))
	for i, v := range values {
		bits := math.Float32bits(v)
		if v != v {
			bits |= 0x00400000 // quiet NaN: rounding must not carry it to infinity
		} else {
			bits += 0x7FFF + (bits>>16)&1
		}
		binary.LittleEndian.PutUint16(out[2*i:], uint16(bits>>16))
	}
	return out
}

// BytesFloat32 decodes little-endian float32s.
func BytesFloat32(data []byte) ([]float32, error) {
	if len(data)%4 != 0 {
		return nil, fmt.Errorf("%d bytes is not a whole number of float32s", len(data))
	}
	out := make([]float32, len(data)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
	}
	return out, nil
}

// Chunks splits one tensor's bytes into chunks of at most size bytes, each with
// its CRC32C. A zero-length tensor still gets one (empty) chunk.
func Chunks(tensorIndex uint32, data []byte, size int) []*pb.TensorChunk {
	var out []*pb.TensorChunk
	for offset := 0; offset == 0 || offset < len(data); offset += size {
		end := min(offset+size, len(data))
		piece := data[offset:end]
		out = append(out, &pb.TensorChunk{
			TensorIndex: tensorIndex, Offset: uint64(offset), Data: piece, Crc32C: CRC32C(piece),
		})
		if end == len(data) {
			break
		}
	}
	return out
}

// Assembler rebuilds tensors from a stream's chunks, refusing a chunk whose
// CRC does not match or that is out of order.
type Assembler struct {
	specs []*pb.TensorSpec
	data  [][]byte
}

// NewAssembler expects the chunks of the tensors in specs.
func NewAssembler(specs []*pb.TensorSpec) *Assembler {
	return &Assembler{specs: specs, data: make([][]byte, len(specs))}
}

// Add appends one chunk.
func (a *Assembler) Add(c *pb.TensorChunk) error {
	i := int(c.GetTensorIndex())
	if i >= len(a.specs) {
		return fmt.Errorf("chunk for tensor %d of %d", i, len(a.specs))
	}
	if CRC32C(c.GetData()) != c.GetCrc32C() {
		return fmt.Errorf("CRC32C mismatch in %s at offset %d", a.specs[i].GetName(), c.GetOffset())
	}
	if c.GetOffset() != uint64(len(a.data[i])) {
		return fmt.Errorf("chunk of %s at offset %d, expected %d", a.specs[i].GetName(), c.GetOffset(), len(a.data[i]))
	}
	a.data[i] = append(a.data[i], c.GetData()...)
	return nil
}

// Bytes returns the bytes received for the tensor at index i.
func (a *Assembler) Bytes(i int) []byte { return a.data[i] }
