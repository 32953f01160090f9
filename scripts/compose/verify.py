"""Inside a trainer image: a finished job's weights against a one-process reference run.

    python - COORDINATORS JOB_ID < scripts/compose/verify.py
prints one JSON line: the job's state, the version pulled, the number of tensors
and whether every tensor is bitwise equal to stalwart.training.reference_run.
"""

import asyncio
import json
import sys

from stalwart import exporting, training
from stalwart.client.coordinator import CoordinatorClient
from stalwart.demo.report import bitwise_equal


async def pull(addresses: str, job_id: str):
    async with CoordinatorClient(addresses, call_timeout_s=30.0, retry_for_s=120.0) as client:
        job = await client.get_job(job_id)
        # The weights once every step is in: the version equal to the job's steps.
        return job, await exporting.pull_live(client, job_id, min_version=job.spec.steps)


def main() -> None:
    addresses, job_id = sys.argv[1], sys.argv[2]
    job, exported = asyncio.run(pull(addresses, job_id))
    training.make_deterministic(1)  # the trainers' setting: one intra-op thread
    want = training.reference_run(job.spec)
    equal, differ = bitwise_equal(exported.weights, want)
    # How far apart, where they differ: rounding (~1e-7) or a lost or doubled update.
    gap = max(((exported.weights[n] - want[n]).abs().max().item() for n in differ
               if n in exported.weights and n in want), default=0.0)  # fmt: skip
    print(json.dumps({"version": exported.version, "steps": job.spec.steps,
                      "tensors": len(exported.weights), "bitwise_equal": equal,
                      "differ": differ, "max_abs_diff": gap}))  # fmt: skip


main()
