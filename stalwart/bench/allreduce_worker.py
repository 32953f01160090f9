"""One rank of ``stalwart bench exchange``'s baseline: gloo all_reduce of one tensor.

Run under torchrun. Rank 0 writes the seconds of each timed all_reduce (after
one warm-up), one per line, to ``--out``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    tensor = torch.full((args.mib * 1024 * 1024 // 4,), 1e-3)
    times = []
    for i in range(args.repeats + 1):
        dist.barrier()
        started = time.perf_counter()
        dist.all_reduce(tensor)
        if i:  # the first call sets up the connections' buffers
            times.append(time.perf_counter() - started)
    if dist.get_rank() == 0:
        args.out.write_text("\n".join(f"{t:.6f}" for t in times))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
