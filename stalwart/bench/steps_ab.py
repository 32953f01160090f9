"""Stalwart's side of ``bench ddp`` alone, for before/after comparisons of a change.

``python -m stalwart.bench.steps_ab [JOBS] [STEPS] [STANDBYS]`` starts the default
local cluster once (3 trainers, STANDBYS warm standbys, default 1), runs JOBS
fault-free jobs of ``bench ddp``'s workload one after the other (default 2 of
200 steps) and prints one JSON line per job: steady
steps/s and the step timeline exactly as ``bench ddp`` computes them, whether
the final weights are bitwise equal to ``reference_run``, and the load average.
No DDP run and no kill: a minute or two per arm instead of ten.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from stalwart import cluster, training
from stalwart.bench import ddp
from stalwart.client.coordinator import CoordinatorClient
from stalwart.demo import report

WARMUP = 20


async def _jobs(local, spec, jobs: int, reference) -> None:
    async with CoordinatorClient(local.coordinator_addresses, retry_for_s=30.0) as client:
        for _ in range(jobs):
            out = await ddp._job(local, client, spec, WARMUP, None, 900.0)
            line = {
                "steps_per_s": round(out["steps_per_s"], 2),
                "phases_ms": out["phases_ms"],
                "bitwise_equal_to_reference": report.bitwise_equal(out["weights"], reference)[0],
                "standbys": local.config.standbys,
                "load_average_1m": round(os.getloadavg()[0], 1),
            }
            print(json.dumps(line), flush=True)


def main(jobs: int = 2, steps: int = 200, standbys: int = 1) -> None:
    training.make_deterministic(1)
    spec = ddp.workload(steps)
    reference = training.reference_run(spec)
    local = cluster.start(
        cluster.ClusterConfig(trainers=3, standbys=standbys, launcher=True, stop_with_caller=True)
    )
    try:
        asyncio.run(cluster.wait_healthy(local, 300))
        asyncio.run(_jobs(local, spec, jobs, reference))
    finally:
        local.stop(timeout_s=10)


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:4]))
