// Tensors on the wire: a spec (name, dtype, shape) announced in a stream's
// header, then its little-endian bytes in chunks, each with its CRC32C, in
// order (offsets contiguous from zero) and tensors in the order of the specs.

import { crc32c } from "./crc32c";
import { Dtype, type TensorChunk, type TensorSpec } from "./gen/stalwart/v1/common";

/** Bytes per element of each dtype. */
export const DTYPE_BYTES: Partial<Record<Dtype, number>> = {
  [Dtype.DTYPE_FLOAT32]: 4,
  [Dtype.DTYPE_FLOAT64]: 8,
  [Dtype.DTYPE_FLOAT16]: 2,
  [Dtype.DTYPE_BFLOAT16]: 2,
  [Dtype.DTYPE_INT64]: 8,
  [Dtype.DTYPE_INT32]: 4,
  [Dtype.DTYPE_INT16]: 2,
  [Dtype.DTYPE_INT8]: 1,
  [Dtype.DTYPE_UINT8]: 1,
  [Dtype.DTYPE_BOOL]: 1,
};

/** One tensor: its spec and its raw little-endian bytes. */
export interface Tensor {
  spec: TensorSpec;
  data: Buffer;
}

/**
 * Float32 values as little-endian bfloat16, each rounded to nearest with ties to
 * even, as torch rounds them: what a job with gradient_dtype DTYPE_BFLOAT16 expects
 * a float32 parameter's gradient in (docs/models.md, "Gradients on the wire").
 * A NaN stays a NaN.
 */
export function bfloat16Bytes(values: Float32Array | readonly number[]): Buffer {
  const f32 = values instanceof Float32Array ? values : Float32Array.from(values);
  const bits = new Uint32Array(f32.buffer, f32.byteOffset, f32.length);
  const out = Buffer.alloc(2 * f32.length);
  for (let i = 0; i < f32.length; i++) {
    let b = bits[i];
    if (Number.isNaN(f32[i])) {
      b |= 0x00400000; // quiet NaN: rounding must not carry it to infinity
    } else {
      b = (b + 0x7fff + ((b >>> 16) & 1)) >>> 0;
    }
    out.writeUInt16LE(b >>> 16, 2 * i);
  }
  return out;
}

/** Bytes a tensor of this spec must have. */
export function byteLength(spec: TensorSpec): number {
  const size = DTYPE_BYTES[spec.dtype];
  if (size === undefined) {
    throw new Error(`tensor ${spec.name}: unknown dtype ${spec.dtype}`);
  }
  return spec.shape.reduce((n, d) => n * d, 1) * size;
}

/** Split bytes into chunks of at most size bytes, each with its CRC32C (one empty chunk for no bytes). */
export function chunks(tensorIndex: number, data: Buffer, size: number): TensorChunk[] {
  const out: TensorChunk[] = [];
  for (let offset = 0; offset === 0 || offset < data.length; offset += size) {
    const piece = data.subarray(offset, Math.min(offset + size, data.length));
    out.push({ tensorIndex, offset, data: piece, crc32c: crc32c(piece) });
    if (offset + size >= data.length) {
      break;
    }
  }
  return out;
}

/** Rebuilds tensors from a stream's chunks; refuses a corrupt, misplaced or missing chunk. */
export class Assembler {
  private readonly parts: Buffer[][];
  private readonly received: number[];

  constructor(private readonly specs: TensorSpec[]) {
    this.parts = specs.map(() => []);
    this.received = specs.map(() => 0);
  }

  add(chunk: TensorChunk): void {
    const i = chunk.tensorIndex;
    const spec = this.specs[i];
    if (spec === undefined) {
      throw new Error(`chunk for tensor ${i} of ${this.specs.length}`);
    }
    if (crc32c(chunk.data) !== chunk.crc32c) {
      throw new Error(`CRC32C mismatch in ${spec.name} at offset ${chunk.offset}`);
    }
    if (chunk.offset !== this.received[i]) {
      throw new Error(`chunk of ${spec.name} at offset ${chunk.offset}, expected ${this.received[i]}`);
    }
    if (this.received[i] + chunk.data.length > byteLength(spec)) {
      throw new Error(`${spec.name}: more bytes than its shape holds`);
    }
    this.parts[i].push(chunk.data);
    this.received[i] += chunk.data.length;
  }

  /** Every tensor, checked complete. */
  finish(): Tensor[] {
    return this.specs.map((spec, i) => {
      if (this.received[i] !== byteLength(spec)) {
        throw new Error(`${spec.name}: got ${this.received[i]} of ${byteLength(spec)} bytes`);
      }
      return { spec, data: Buffer.concat(this.parts[i]) };
    });
  }
}
