"""Keep freed memory in the process for the next allocation of the same size.

A push allocates its gradient and its received messages afresh (tensors and
bytes of a chunk's size, 4 MiB by default) and frees them once applied. glibc
raises its mmap threshold to the size of the first such block freed, serves
the next ones from the heap, and gives the top of the heap back to the kernel
as soon as more than twice that is free: so every push faulted its pages in
again, and the kernel zeroed each one, a pass over every byte (23 000 minor
faults and 50-110 ms of system time per 64 MiB push on the primary of
``stalwart bench ps``). With the thresholds fixed high, freed blocks are
reused as they are; the cost is that the process keeps its peak heap.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's largest; bigger blocks are still mapped afresh
TRIM_THRESHOLD_BYTES = 1 << 30


def keep_freed_memory() -> bool:
    """Fix glibc's malloc thresholds (see the module docstring); False where the
    C library is not glibc (nothing changed)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
        and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
