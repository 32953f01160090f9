"""A step committed on one shard group only, whose slot trainer is restarted fresh.

Group 1's primary dies with every push of step N received and none forwarded to its
backup (``crash_before_commit_at_version``), while group 0 commits step N. At that
moment the trainer of slot 1 is killed and started again under its own id, as a
supervisor would: it holds slot 1 again, but no weights of version N, so it cannot
push slot 1's step N to the promoted backup. Nor could anyone else: the surviving
trainer finished the lagging step for its own slot only, and the job stood still for
good. A trainer holding the lagging version now pushes that step for every slot.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stalwart import cluster
from stalwart.api import coordinator
from stalwart.client.coordinator import CoordinatorClient
from tests.integration.cluster.support import (
    assert_bitwise_equal,
    finish_and_pull,
    reference,
    running_cluster,
    small_spec,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

LAGGING = 20  # group 1's primary dies committing step 20


@pytest.fixture
def lagging(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cluster.LocalCluster]:
    """2 coordinators; 2 shard groups (group 1's primary with the fault, which fires
    once: a cluster per test); 2 trainers, no standby (a standby would hold version
    N and finish the step)."""
    root = Path(tmp_path_factory.mktemp("runs"))
    faults = {"ps-1a": ("--faults", f"crash_before_commit_at_version={LAGGING}")}
    with running_cluster(root, trainers=2, standbys=0, shards=2, member_args=faults) as started:
        yield started


async def _run(local: cluster.LocalCluster, spec) -> tuple[coordinator.Job, int, dict, str]:
    async with CoordinatorClient(local.coordinator_addresses, retry_for_s=30.0) as client:
        job = await client.create_job(spec)
        deadline = time.monotonic() + 120
        while local.alive("ps-1a"):  # the fault fires at step LAGGING
            assert time.monotonic() < deadline, "group 1's primary never crashed"
            await asyncio.sleep(0.01)
        held = (await client.get_job(job.job_id)).slots
        name = next(s.node_id for s in held if s.slot == 1)
        await asyncio.to_thread(local.kill, name)
        await asyncio.to_thread(local.restart, name)
        job, version, weights = await finish_and_pull(client, job, spec)
        return job, version, weights, name


@pytest.mark.parametrize("duplicate_rate", [0.0, 1.0], ids=["plain", "duplicate-compute"])
def test_a_fresh_slot_trainer_and_a_lagging_group_still_end_bitwise_equal(
    lagging, duplicate_rate: float
):
    """With duplicate compute on every batch, the surviving trainer's push of the
    restarted slot's lagging step (a slot it does not hold) passes the same check as
    its own: nobody else can compute that batch, and the job must not wait on it."""
    spec = small_spec(steps=40)
    spec.num_shards = 2
    spec.duplicate_compute_rate = duplicate_rate
    want = reference(spec)
    job, version, weights, restarted = asyncio.run(_run(lagging, spec))
    assert job.state == coordinator.JOB_STATE_SUCCEEDED, job.reason
    assert version == spec.steps and restarted.startswith("trainer-")
    assert_bitwise_equal(weights, want)
