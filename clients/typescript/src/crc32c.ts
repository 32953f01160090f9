// CRC32C (Castagnoli, reflected polynomial 0x82F63B78, initial and final XOR
// 0xFFFFFFFF): the checksum every TensorChunk carries. Table-driven, one byte
// at a time; fast enough for a client (hundreds of MB/s).

const TABLE = (() => {
  const table = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) {
      c = c & 1 ? (c >>> 1) ^ 0x82f63b78 : c >>> 1;
    }
    table[n] = c >>> 0;
  }
  return table;
})();

/** CRC32C of data, continuing crc (the CRC of the bytes before it; 0 to start). */
export function crc32c(data: Uint8Array, crc = 0): number {
  let c = ~crc >>> 0;
  for (let i = 0; i < data.length; i++) {
    c = TABLE[(c ^ data[i]) & 0xff] ^ (c >>> 8);
  }
  return ~c >>> 0;
}
