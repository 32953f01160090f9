"""CRC32C (Castagnoli): the checksum carried next to every chunk, on the wire and at rest.

One function for both places (``stalwart.codec`` and ``stalwart.stores``).
google_crc32c reads only objects whose buffer needs no release: bytes, and
numpy arrays, but not a memoryview. A memoryview (a slice of tensor memory, or
of a received message) is therefore read through a numpy array over the same
memory, in place. It used to be copied to bytes in 64 KiB pieces: a second
pass over every byte, which cost about as much as the CRC itself.
"""

from __future__ import annotations

import google_crc32c
import numpy as np

PIECE_BYTES = 64 * 1024  # the pure-Python fallback's pieces (no C extension)
_IN_PLACE = google_crc32c.implementation == "c"


def crc32c(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """CRC32C of ``data``, continuing ``crc`` (the CRC of what came before it)."""
    if isinstance(data, bytearray):
        data = memoryview(data)
    if isinstance(data, memoryview):
        view = data if data.format == "B" and data.ndim == 1 else data.cast("B")
        if not _IN_PLACE:
            for start in range(0, len(view), PIECE_BYTES):
                crc = google_crc32c.extend(crc, bytes(view[start : start + PIECE_BYTES]))
            return crc
        data = np.frombuffer(view, dtype=np.uint8) if len(view) else b""
    return google_crc32c.extend(crc, data) if crc else google_crc32c.value(data)
