"""Recovery figures of the demo's kills over many runs (docs/paramserver.md, "A
primary's failover, from the trainers' side").

    .venv/bin/python scripts/failover_figures.py [--runs 12] [--no-health] [--runs-root DIR]

Runs ``stalwart demo``'s script that many times, without the fault-free reference
run (the kills, their schedule and the recovery rules are the demo's), and prints one
JSON line per run (kill -> next committed step of each fault) and then, per fault
kind, the median, the smallest and the largest. One run takes about 25 s on two
idle cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from pathlib import Path

from stalwart.demo import run as demo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=12)
    parser.add_argument("--no-health", action="store_true", help="no health service, no heating")
    parser.add_argument("--runs-root", type=Path, default=Path("runs"))
    args = parser.parse_args()
    config = demo.DemoConfig(health=not args.no_health, reference=False, runs_root=args.runs_root)
    seconds: dict[str, list[float]] = {}
    for index in range(args.runs):
        faults = asyncio.run(demo.run(config))["faults"]
        row = {f["kind"]: f["recovery_s"] for f in faults}
        print(json.dumps({"run": index, "recovery_s": row}), flush=True)
        for kind, value in row.items():
            if value is not None:
                seconds.setdefault(kind, []).append(value)
    summary = {
        kind: {"median": round(statistics.median(v), 3), "min": min(v), "max": max(v),
               "runs": len(v)}
        for kind, v in seconds.items()
    }  # fmt: skip
    print(json.dumps({"summary": summary}))


if __name__ == "__main__":
    main()
