"""CRC32C (Castagnoli): the checksum carried next to every chunk, on the wire and at rest.

One function for both places (``stalwart.codec`` and ``stalwart.stores``).
google_crc32c takes only bytes-like objects that need no buffer release, so a
memoryview (a slice of tensor memory) goes through in pieces this big: a copy
that stays in cache, where one copy of a whole multi-MiB buffer would cost more
than the CRC itself.
"""

from __future__ import annotations

import google_crc32c

PIECE_BYTES = 64 * 1024


def crc32c(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """CRC32C of ``data``, continuing ``crc`` (the CRC of what came before it)."""
    if not isinstance(data, memoryview):
        return google_crc32c.extend(crc, data) if crc else google_crc32c.value(data)
    view = data if data.format == "B" and data.ndim == 1 else data.cast("B")
    for start in range(0, len(view), PIECE_BYTES):
        crc = google_crc32c.extend(crc, bytes(view[start : start + PIECE_BYTES]))
    return crc
