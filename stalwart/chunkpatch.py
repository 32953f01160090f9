"""Row-level deltas: a chunk stored as the blocks that changed against a base chunk.

A checkpoint chunk of an embedding table with 1% of its rows touched differs
from the previous one in a few scattered rows; storing the whole 4 MiB chunk
again (a chunk-level delta) saves nothing. A *patch* keeps only the changed
fixed-size blocks: their indices and bytes. Applying it to the base chunk's
bytes gives the new chunk back, bit for bit.

Format (little-endian), ``PATCH_MAGIC`` first so a stray blob is never mistaken
for a patch::

    magic "SWP1" | block_bytes u32 | chunk_size u64 | count u32 |
    count x block index u32 (ascending) | the blocks' bytes, in index order

Every block is ``block_bytes`` long except possibly the chunk's last one.
Pure bytes in, bytes out (numpy only); the checksums and the store addressing
live in :mod:`stalwart.checkpoint`.
"""

from __future__ import annotations

import struct

import numpy as np

from stalwart.errors import ErrorKind, StalwartError

PATCH_MAGIC = b"SWP1"
_HEADER = struct.Struct("<4sIQI")
DEFAULT_BLOCK_BYTES = 256  # one 64-dim float32 row; 4-byte index = 1.6% overhead
MIN_BLOCK_BYTES = 16
MAX_BLOCK_BYTES = 1 << 20


def check_block_bytes(block_bytes: int) -> int:
    if not MIN_BLOCK_BYTES <= block_bytes <= MAX_BLOCK_BYTES:
        raise StalwartError(
            ErrorKind.INVALID_ARGUMENT,
            f"patch block size must be in [{MIN_BLOCK_BYTES}, {MAX_BLOCK_BYTES}], got {block_bytes}",
        )
    return block_bytes


def changed_blocks(
    base: bytes | memoryview, new: bytes | memoryview, block_bytes: int
) -> np.ndarray:
    """Indices (uint32, ascending) of the blocks where ``new`` differs from ``base``."""
    if len(base) != len(new):
        raise ValueError(f"base holds {len(base)} bytes, new {len(new)}")
    a = np.frombuffer(base, dtype=np.uint8)
    b = np.frombuffer(new, dtype=np.uint8)
    full = len(a) // block_bytes
    head = full * block_bytes
    diff = (a[:head] != b[:head]).reshape(full, block_bytes).any(axis=1)
    out = np.flatnonzero(diff).astype(np.uint32)
    if head < len(a) and not np.array_equal(a[head:], b[head:]):
        out = np.append(out, np.uint32(full))
    return out


def patch_size(chunk_size: int, block_bytes: int, blocks: np.ndarray) -> int:
    """Bytes of the patch that ``blocks`` make, without building it."""
    data = len(blocks) * block_bytes
    if len(blocks) and int(blocks[-1]) * block_bytes + block_bytes > chunk_size:
        data -= int(blocks[-1]) * block_bytes + block_bytes - chunk_size  # short last block
    return _HEADER.size + 4 * len(blocks) + data


def make_patch(new: bytes | memoryview, block_bytes: int, blocks: np.ndarray) -> bytes:
    """The patch that writes ``new``'s ``blocks`` over a base of the same size."""
    view = memoryview(new)
    parts = [
        _HEADER.pack(PATCH_MAGIC, block_bytes, len(view), len(blocks)),
        blocks.astype("<u4").tobytes(),
    ]
    parts += [view[int(i) * block_bytes : int(i) * block_bytes + block_bytes] for i in blocks]
    return b"".join(parts)


def apply_patch(base: bytes | memoryview, patch: bytes | memoryview) -> bytes:
    """``base`` with the patch's blocks written over it; DATA_LOSS if the patch does
    not fit the base (callers verify both blobs' hashes first, so this means a
    patch made against another base or a writer bug)."""
    view = memoryview(patch)
    if len(view) < _HEADER.size:
        raise _bad("shorter than its header")
    magic, block_bytes, chunk_size, count = _HEADER.unpack_from(view)
    if magic != PATCH_MAGIC or not MIN_BLOCK_BYTES <= block_bytes <= MAX_BLOCK_BYTES:
        raise _bad("bad header")
    if chunk_size != len(base):
        raise _bad(f"made for a {chunk_size}-byte chunk, the base holds {len(base)}")
    body = _HEADER.size + 4 * count
    if len(view) < body:
        raise _bad("index list truncated")
    blocks = np.frombuffer(view[_HEADER.size : body], dtype="<u4")
    if count and (
        int(blocks[-1]) * block_bytes >= chunk_size or np.any(np.diff(blocks.astype(np.int64)) <= 0)
    ):
        raise _bad("block indices out of range or not ascending")
    if len(view) != patch_size(chunk_size, block_bytes, blocks):
        raise _bad("size does not match its block list")
    out = bytearray(base)
    offset = body
    for i in blocks:
        start = int(i) * block_bytes
        end = min(start + block_bytes, chunk_size)
        out[start:end] = view[offset : offset + end - start]
        offset += end - start
    return bytes(out)


def _bad(why: str) -> StalwartError:
    return StalwartError(ErrorKind.DATA_LOSS, f"checkpoint patch {why}")
