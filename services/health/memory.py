"""Give memory freed by the Python side back to the operating system.

Reading a fleet export leaves many small per-entity arrays freed (the raw rows once
they are sorted, gap-filled and cleaned). The C allocator keeps such holes for reuse
instead of returning them, and the large arrays built next (windows) are mapped
fresh, so without this the peak RSS counts the export's raw rows beside its windows.
"""

from __future__ import annotations

import ctypes
import sys


def release_freed() -> None:
    """glibc's ``malloc_trim(0)`` (nothing where there is no glibc), and Arrow's pool's
    unused memory when pyarrow is loaded. Frees nothing that is still in use."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    if "pyarrow" in sys.modules:
        sys.modules["pyarrow"].default_memory_pool().release_unused()
