// Unit checks of the helper layer (node --test): CRC32C known values, chunk
// assembly refusing corrupt or misplaced chunks, joining row pieces, and bfloat16
// encoding.

import { strict as assert } from "node:assert";
import { test } from "node:test";
import { Assembler, bfloat16Bytes, chunks, crc32c, joinPieces } from "../src/index";
import { Dtype } from "../src/gen/stalwart/v1/common";

test("crc32c known values", () => {
  assert.equal(crc32c(Buffer.from("123456789")), 0xe3069283);
  assert.equal(crc32c(Buffer.alloc(32)), 0x8a9136aa);
  assert.equal(crc32c(Buffer.from("6789"), crc32c(Buffer.from("12345"))), 0xe3069283);
});

test("chunks reassemble; a corrupt or misplaced chunk is refused", () => {
  const spec = { name: "w", dtype: Dtype.DTYPE_FLOAT32, shape: [3] };
  const data = Buffer.from(new Float32Array([1, 2, 3]).buffer);
  const parts = chunks(0, data, 4);
  assert.equal(parts.length, 3);
  const ok = new Assembler([spec]);
  parts.forEach((c) => ok.add(c));
  assert.deepEqual(ok.finish()[0].data, data);

  const bad = new Assembler([spec]);
  assert.throws(() => bad.add({ ...parts[0], data: Buffer.from([9, 9, 9, 9]) }), /CRC32C mismatch/);
  assert.throws(() => new Assembler([spec]).add(parts[1]), /expected 0/);
  const short = new Assembler([spec]);
  short.add(parts[0]);
  assert.throws(() => short.finish(), /got 4 of 12 bytes/);
});

test("row pieces join in row order", () => {
  const piece = (rows: string, start: number, end: number, shard: number) => ({
    tensorName: "e", pieceName: `e#rows=${rows}`, shard, rowStart: start, rowEnd: end,
  });
  const t = (name: string, rows: number, fill: number) => ({
    spec: { name, dtype: Dtype.DTYPE_UINT8, shape: [rows, 2] },
    data: Buffer.alloc(rows * 2, fill),
  });
  const joined = joinPieces(
    [piece("2:3", 2, 3, 1), piece("0:2", 0, 2, 0)],
    new Map([["e#rows=0:2", t("e#rows=0:2", 2, 1)], ["e#rows=2:3", t("e#rows=2:3", 1, 2)]]),
  );
  const e = joined.get("e");
  assert.deepEqual(e?.spec.shape, [3, 2]);
  assert.deepEqual([...(e?.data ?? [])], [1, 1, 1, 1, 2, 2]);
});

test("bfloat16 rounds as torch does", () => {
  // expected halves from torch: tensor(values).to(torch.bfloat16)
  const values = [1.0, -2.5, 1.00390625, 1.01171875, 3.4028234663852886e38, 1e-40, 0.1, -0];
  const want = [0x3f80, 0xc020, 0x3f80, 0x3f82, 0x7f80, 0x0001, 0x3dcd, 0x8000];
  const got = bfloat16Bytes(values);
  assert.equal(got.length, 2 * values.length);
  want.forEach((w, i) => assert.equal(got.readUInt16LE(2 * i), w, `value ${values[i]}`));
  const nan = bfloat16Bytes(new Float32Array([NaN])).readUInt16LE(0);
  assert.ok((nan & 0x7f80) === 0x7f80 && (nan & 0x007f) !== 0, `NaN encoded as ${nan}`);
});
