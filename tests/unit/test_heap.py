"""glibc's malloc thresholds, fixed so that a push's freed buffers are reused."""

from __future__ import annotations

import resource
import subprocess
import sys

PROBE = """
import resource, sys
from stalwart import heap
if sys.argv[1] == "keep":
    assert heap.keep_freed_memory()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):  # let glibc's threshold settle first
    blocks = [bytearray(4 << 20) for _ in range(8)]
    del blocks
before = faults()
for _ in range(10):
    blocks = [bytearray(4 << 20) for _ in range(8)]
    del blocks
print(faults() - before)
"""


def _faults(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True
    )
    return int(out.stdout.strip())


def test_freed_blocks_of_a_chunks_size_are_reused_without_page_faults():
    assert resource.getpagesize() <= 1 << 16
    churn = _faults("default")
    kept = _faults("keep")
    pages = 10 * 8 * (4 << 20) // resource.getpagesize()
    assert churn > pages // 2  # glibc hands the heap back and faults it in again
    assert kept < pages // 20
