"""A paramserver promoted by hand without the job's state does not take the group over.

`stalwart ps promote` (a bare ``Promote`` call) of the group's warm spare, which holds
no job, at an epoch above the group's: the leader used to adopt it as the group's
primary (the highest epoch claiming primary) and made the backup its backup, so the
running job stood still for good: its trainers found the job missing there and could
not register state the group had already committed. The leader now keeps the
recorded primary and promotes it again above the stray epoch (a client searching for
the primary takes the highest epoch); the job goes on and ends bitwise equal to a
fault-free run.

Its own cluster: the stray primary stays in the group after the test.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from stalwart import cluster
from stalwart.api import coordinator
from stalwart.cli.main import app
from stalwart.client.coordinator import CoordinatorClient
from tests.integration.cluster.support import (
    JOB_TIMEOUT_S,
    assert_bitwise_equal,
    finish_and_pull,
    reference,
    running_cluster,
    small_spec,
    watched_job,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

STRAY_EPOCH = 1000
STEPS_AFTER = 10  # steps the job must commit after the stray promotion


def _promote_by_hand(address: str) -> None:
    result = CliRunner().invoke(app, ["ps", "promote", "-a", address, "--epoch", str(STRAY_EPOCH)])
    assert result.exit_code == 0, result.output


def _jobs_on(address: str) -> list[str]:
    result = CliRunner().invoke(app, ["ps", "status", "-a", address, "-o", "json"])
    assert result.exit_code == 0, result.output
    return [j["job_id"] for j in json.loads(result.output).get("jobs", [])]


async def _run(local: cluster.LocalCluster, spec: coordinator.JobSpec):
    async with (
        CoordinatorClient(local.coordinator_addresses, retry_for_s=30.0) as client,
        watched_job(client, spec) as (job, recorder),
    ):
        assert await recorder.wait_step(10, JOB_TIMEOUT_S), "job never got to step 10"
        group = (await client.get_shard_map(job.job_id)).groups[0]
        replicas = local.of_role("paramserver")
        held = [await asyncio.to_thread(_jobs_on, m.address) for m in replicas]  # one at a time:
        # CliRunner swaps sys.stdout for the whole process
        spare = next(m for m, jobs in zip(replicas, held, strict=True) if job.job_id not in jobs)
        await asyncio.to_thread(_promote_by_hand, spare.address)
        promoted_at = recorder.step
        went_on = await recorder.wait_step(promoted_at + STEPS_AFTER, JOB_TIMEOUT_S)
        after = (await client.get_shard_map(job.job_id)).groups[0]
        job, version, weights = await finish_and_pull(client, job, spec)
    return job, version, weights, group, after, went_on, promoted_at


def test_a_spare_promoted_by_hand_without_the_job_does_not_stall_it(tmp_path: Path):
    spec = small_spec(steps=80, seed=11)
    with running_cluster(tmp_path, trainers=2, standbys=0) as local:
        job, version, weights, before, after, went_on, at = asyncio.run(_run(local, spec))
    assert went_on, f"the job stood still at step {at} after the spare was promoted by hand"
    # the same primary, raised above the stray epoch (clients search by epoch)
    assert after.primary_address == before.primary_address
    assert after.epoch > STRAY_EPOCH
    assert job.state == coordinator.JOB_STATE_SUCCEEDED, job.reason
    assert version == spec.steps
    assert_bitwise_equal(weights, reference(spec))
