"""Quick store throughput check: raw put/get MB/s of one chunk size per backend.

    .venv/bin/python scripts/backends/measure.py URL [URL...] [--mib 4] [--rounds 20]

Each round puts a fresh random chunk (so nothing is skipped as already stored)
and reads it back with verification on; the figure includes the SHA-256 check
put_chunk and get_chunk do. Single client, single thread, no warm-up beyond one
discarded round. Numbers for docs/stores.md, not a benchmark suite.
"""

from __future__ import annotations

import argparse
import os
import time

from stalwart.stores import chunk_hash, open_store


def measure(url: str, size: int, rounds: int) -> tuple[float, float]:
    with open_store(url) as store:
        chunks = [os.urandom(size) for _ in range(rounds + 1)]
        hashes = [chunk_hash(c) for c in chunks]
        store.put_chunk(hashes[0], chunks[0])
        store.get_chunk(hashes[0])
        put_s = get_s = 0.0
        for h, c in zip(hashes[1:], chunks[1:], strict=True):
            t0 = time.perf_counter()
            store.put_chunk(h, c)
            t1 = time.perf_counter()
            assert store.get_chunk(h) == c
            get_s += time.perf_counter() - t1
            put_s += t1 - t0
        for h in hashes:
            store.delete_chunk(h)
    mb = size * rounds / 1e6
    return mb / put_s, mb / get_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("urls", nargs="+")
    ap.add_argument("--mib", type=float, default=4)
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    size = int(args.mib * (1 << 20))
    print(f"{'store':<40} {'put MB/s':>9} {'get MB/s':>9}   ({args.mib:g} MiB chunks)")
    for url in args.urls:
        put, get = measure(url, size, args.rounds)
        print(f"{url:<40} {put:9.0f} {get:9.0f}")


if __name__ == "__main__":
    main()
