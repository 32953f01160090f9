"""A paramserver promoted by hand without the job's state does not take the group over.

`stalwart ps promote` (a bare ``Promote`` call) of the group's warm spare, which holds
no job, at an epoch above the group's: the leader used to adopt it as the group's
primary (the highest epoch claiming primary) and made the backup its backup, so the
running job stood still for good: its trainers found the job missing there and could
not register state the group had already committed. The leader now keeps the
recorded primary and promotes it again above the stray epoch (a client searching for
the primary takes the highest epoch); the job goes on and ends bitwise equal to a
fault-free run. With the group's backup given to the promotion (``-b``), the primary
is fenced under it: the leader now promotes that backup instead of waiting for the
fenced primary.

Its own cluster: the stray primaries stay in the group after the tests.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
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

STEPS_AFTER = 10  # steps the job must commit after the stray promotion


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cluster.LocalCluster]:
    with running_cluster(Path(tmp_path_factory.mktemp("runs")), trainers=2, standbys=0) as c:
        yield c


def _cli(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def _status(address: str) -> dict:
    return json.loads(_cli("ps", "status", "-a", address, "-o", "json"))


async def _group_above(client: CoordinatorClient, job_id: str, epoch: int):
    """The job's shard group once its recorded epoch is above ``epoch``."""
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while (group := (await client.get_shard_map(job_id)).groups[0]).epoch <= epoch:
        assert time.monotonic() < deadline, f"the group stayed at epoch {group.epoch} <= {epoch}"
        await asyncio.sleep(0.2)
    return group


async def _run(local: cluster.LocalCluster, spec: coordinator.JobSpec, with_backup: bool):
    """Run ``spec``; at step 10 promote by hand, 1,000 epochs above the group's, a
    replica that lacks the job (with the group's backup that holds it, ``with_backup``);
    the shard group before and after, and the backup."""
    async with (
        CoordinatorClient(local.coordinator_addresses, retry_for_s=30.0) as client,
        watched_job(client, spec) as (job, recorder),
    ):
        assert await recorder.wait_step(10, JOB_TIMEOUT_S), "job never got to step 10"
        group = (await client.get_shard_map(job.job_id)).groups[0]
        replicas = [m.address for m in local.of_role("paramserver")]
        # one at a time: CliRunner swaps sys.stdout for the whole process
        status = {a: await asyncio.to_thread(_status, a) for a in replicas}
        held = {a: {j["job_id"] for j in st.get("jobs", [])} for a, st in status.items()}
        lacking = next(a for a in replicas if job.job_id not in held[a])
        backup = next(a for a in replicas if job.job_id in held[a] and a != group.primary_address)
        epoch = max(int(st.get("epoch", 0)) for st in status.values()) + 1000
        flags = ["-b", backup] if with_backup else []
        await asyncio.to_thread(_cli, "ps", "promote", "-a", lacking, "--epoch", str(epoch), *flags)
        promoted_at = recorder.step
        went_on = await recorder.wait_step(promoted_at + STEPS_AFTER, JOB_TIMEOUT_S)
        # the job may go on under the recorded primary before the leader's next look
        # at the group raises it (or its backup) above the stray epoch
        after = await _group_above(client, job.job_id, epoch)
        job, version, weights = await finish_and_pull(client, job, spec)
    assert went_on, f"the job stood still at step {promoted_at} after the promotion by hand"
    assert promoted_at < spec.steps, "the job ended before the promotion: nothing was tested"
    assert job.state == coordinator.JOB_STATE_SUCCEEDED, job.reason
    assert version == spec.steps
    assert_bitwise_equal(weights, reference(spec))
    return group, after, backup, epoch


def test_a_primary_fenced_by_a_hand_promotion_is_replaced_by_its_backup(local):
    """`ps promote -a LACKING -b BACKUP`: the backup, moved to the new epoch, refuses the
    primary's next update and the primary fences itself. The leader waited for it to
    claim primary again, and the job stood still for good. First in this module: only a
    backup that no coordinator leader has configured yet takes a promotion's order
    (the CLI speaks as no leader), as the cluster's first backup is at its start."""
    before, after, backup, _ = asyncio.run(_run(local, small_spec(steps=300, seed=12), True))
    assert after.primary_address == backup != before.primary_address


def test_a_spare_promoted_by_hand_without_the_job_does_not_stall_it(local):
    before, after, _, _ = asyncio.run(_run(local, small_spec(steps=300, seed=11), False))
    # the same primary, raised above the stray epoch (clients search by epoch)
    assert after.primary_address == before.primary_address
