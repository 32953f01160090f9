"""Inside a trainer image: a finished job's weights against a one-process reference run.

    python - COORDINATORS JOB_ID < scripts/compose/verify.py
prints one JSON line: the job's state, the version pulled, the number of tensors
and whether every tensor is bitwise equal to stalwart.training.reference_run.
"""

import asyncio
import json
import sys

from stalwart import training
from stalwart.cli.export import fetch
from stalwart.client.coordinator import CoordinatorClient
from stalwart.demo.report import bitwise_equal


async def pull(addresses: str, job_id: str):
    async with CoordinatorClient(addresses) as client:
        return await fetch(client, job_id, 0)


def main() -> None:
    addresses, job_id = sys.argv[1], sys.argv[2]
    job, version, tensors = asyncio.run(pull(addresses, job_id))
    equal, differ = bitwise_equal(tensors, training.reference_run(job.spec))
    print(json.dumps({"version": version, "steps": job.spec.steps, "tensors": len(tensors),
                      "bitwise_equal": equal, "differ": differ}))  # fmt: skip


main()
