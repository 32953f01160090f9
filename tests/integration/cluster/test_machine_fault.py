"""A trainer whose GPU is full (another process took it) does not fail the job.

torch raises ``OutOfMemoryError`` at every step on that machine only. The error
used to count as the job's own: the trainer reported it three times and the leader
failed the job, although the same model ran on every other trainer. Now the leader
drains that trainer (a machine's device or memory fault, taskerrors.py), its slot
moves to the standby, and the job ends as if nothing happened: bitwise equal to
its reference run.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from stalwart.api import coordinator
from stalwart.client.coordinator import CoordinatorClient
from tests.integration.cluster.support import (
    assert_bitwise_equal,
    reference,
    run_job,
    running_cluster,
    small_spec,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

FULL_FROM = 8  # the step from which trainer-1's device is full


def test_a_trainer_with_a_full_device_is_drained_and_the_job_goes_on(tmp_path: Path) -> None:
    faults = {"trainer-1": ("--faults", f"device_full_from_step={FULL_FROM}")}
    spec = small_spec(steps=30)
    want = reference(spec)
    with running_cluster(tmp_path, trainers=2, standbys=1, member_args=faults) as local:
        out = asyncio.run(run_job(local, spec))
        nodes = asyncio.run(_nodes(local))
    assert out.job.state == coordinator.JOB_STATE_SUCCEEDED, out.job.reason
    assert out.version == spec.steps
    assert_bitwise_equal(out.weights, want)
    assert nodes["trainer-1"] in (coordinator.NODE_STATE_DRAINING, coordinator.NODE_STATE_DRAINED)
    drained = [e for e in out.events if e.kind == "NODE_DRAINED" and e.node_id == "trainer-1"]
    assert drained and "OutOfMemoryError" in drained[0].message


async def _nodes(local) -> dict[str, int]:
    async with CoordinatorClient(local.coordinator_addresses, retry_for_s=30.0) as client:
        return {n.node_id: n.state for n in (await client.list_nodes()).nodes}
