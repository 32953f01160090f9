"""Paramserver replicas that their supervisor restarts under the same node id and
address with their start-up flags (as `docker compose` does with `restart:
unless-stopped`), with real processes.

A primary restarted at once, before the leader finds it dead:
the new process claims primary at the group's epoch again and holds nothing. The
leader tells it from the old one by the instance id in its status and promotes the
backup, which holds every acknowledged step; the trainers' attempts to register fresh
weights on the new process are refused meanwhile. The job finishes bitwise equal to
the fault-free reference run.

A backup restarted after a failover answers with its start-up role and epoch and
refuses its primary's replication; the leader configures it as a backup again and
the primary catches it up."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from stalwart import training
from stalwart.api import common, coordinator, paramserver
from stalwart.client import CoordinatorClient
from tests.helpers import assert_eventually_async
from tests.integration.coordinator.support import wait_leader
from tests.integration.paramserver.support import (
    consistency,
    model_header,
    push_messages,
    push_raw,
    register_raw,
    sgd,
    stubs,
)
from tests.integration.paramserver.support import status as replica_status
from tests.integration.sdc.support import job_events

from .support import assert_bitwise_equal, final_weights, small_spec, wait_trainers
from .test_trainer_with_coordinator import wait_job_done

pytestmark = pytest.mark.timeout(300)

CRASH_AT = 5
PRIMARY, BACKUP = common.REPLICA_ROLE_PRIMARY, common.REPLICA_ROLE_BACKUP
# The leader must not find the old process dead before the new one answers: no
# refused-poll rule, and a lease far longer than a restart takes.
SLOW_DETECTION = ("--paramserver-unreachable-polls", "0", "--node-lease-seconds", "120")


async def wait_replicas(client, names: set[str]) -> None:
    async def registered():
        nodes = await client.all_nodes(common.NODE_ROLE_PARAMSERVER)
        assert {n.node_id for n in nodes} == names

    await assert_eventually_async(registered, timeout=30)


async def wait_gone(proc, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while proc.alive():
        assert time.monotonic() < deadline, proc.log_tail(50)
        await asyncio.sleep(0.05)


async def test_a_primary_restarted_empty_under_its_id_loses_its_group_to_its_backup(
    cluster_procs,
):
    procs = cluster_procs
    spec = small_spec(steps=16)
    training.make_deterministic()
    want = await asyncio.to_thread(training.reference_run, spec)

    coord = procs.coordinator("c1", *SLOW_DETECTION)
    await wait_leader(coord.address)
    join = ("--coordinator", coord.address)
    backup = procs.start("services.paramserver", "ps-b", "--role", "backup", *join)
    primary_args = ("--role", "primary", "--backups", backup.address, *join)
    primary = procs.start("services.paramserver", "ps-p", *primary_args,
                          env={"STALWART_FAULTS": f"crash_at_version={CRASH_AT}"})  # fmt: skip
    port = primary.address.rsplit(":", 1)[1]
    for name in ("tr0", "tr1"):
        procs.trainer(name, *join)

    async with CoordinatorClient(coord.address) as client:
        await wait_trainers(client, {"tr0", "tr1"}, 30)
        job = await client.create_job(spec, job_id="job-restart")
        await wait_gone(primary, 120)
        assert "fault fired" in primary.log_tail(200)
        again = procs.launch("services.paramserver", "ps-p-again", "--node-id", "ps-p",
                             *primary_args, "--port", port)  # fmt: skip
        assert again.address == primary.address
        done = await wait_job_done(client, job.job_id, 180)
        assert done.state == coordinator.JOB_STATE_SUCCEEDED, done.reason
        events = await job_events(client)

    promoted = [e for e in events if e.kind == common.EVENT_KIND_REPLICA_PROMOTED]
    assert [(e.node_id, e.attributes["previous"]) for e in promoted] == [("ps-b", "ps-p")]
    version, got = await final_weights([backup.address], job.job_id, spec)
    assert version == spec.steps
    assert_bitwise_equal(got, want)


async def replica(address: str) -> paramserver.GetReplicaStatusResponse:
    async with stubs() as stub_for:
        return await replica_status(stub_for(address))


def pair(procs, join: tuple[str, ...]):
    """(backup, primary, the primary's flags) of one coordinated shard group."""
    backup = procs.start("services.paramserver", "ps-b", "--role", "backup", *join)
    primary_args = ("--role", "primary", "--backups", backup.address, *join)
    return backup, procs.start("services.paramserver", "ps-p", *primary_args), primary_args


async def three_steps(client, primary_address: str, job_id: str) -> None:
    """Admit a one-slot job, register it on the primary, commit three steps, and wait
    until the leader has polled them and written what it saw."""
    initial = {"w": torch.zeros(4)}
    header = model_header(job_id, initial, sgd(0.1), consistency("sync"), num_slots=1)
    await wait_replicas(client, {"ps-p", "ps-b"})
    await client.create_job(small_spec(num_slots=1), job_id=job_id)
    async with stubs() as stub_for:
        await register_raw(stub_for(primary_address), header, initial)
        for step in range(3):
            grads = {"w": torch.ones(4)}
            await push_raw(stub_for(primary_address), push_messages(job_id, step, 0, grads, step))

    async def stored():  # events are published once the leader's books are written
        events = await job_events(client, job_id)
        assert any(e.kind == common.EVENT_KIND_STEP_COMMITTED and e.step == 3 for e in events)

    await assert_eventually_async(stored, timeout=30)


async def restart_backup(procs, backup, join, job_id: str, timeout: float, *die_with) -> None:
    """Kill the backup (and ``die_with`` beside it), start it again at once under its
    id and port with its flags, and wait until it holds ``job_id`` at version 3."""
    port = backup.address.rsplit(":", 1)[1]
    for proc in (backup, *die_with):
        proc.kill()
    again = procs.launch("services.paramserver", "ps-b-again", "--node-id", "ps-b",
                         "--role", "backup", *join, "--port", port)  # fmt: skip

    async def caught_up():
        got = await replica(again.address)
        assert {j.job_id: j.version for j in got.jobs} == {job_id: 3}

    await assert_eventually_async(caught_up, timeout=timeout)


async def test_a_backup_restarted_with_its_flags_after_a_failover_is_caught_up(cluster_procs):
    # After a failover to epoch 2, the old primary became the new one's backup. Each
    # time it restarts with its start-up flags (primary, epoch 1) it refuses the
    # primary's replication; the leader configures it again and it is caught up.
    procs = cluster_procs
    coord = procs.coordinator("c1")
    await wait_leader(coord.address)
    backup, primary, primary_args = pair(procs, ("--coordinator", coord.address))
    port = primary.address.rsplit(":", 1)[1]

    async with CoordinatorClient(coord.address) as client:
        await three_steps(client, primary.address, "job-r")
        primary.kill()

        async def caught_up(address: str, role: int):
            got = await replica(address)
            assert (got.role, got.epoch) == (role, 2)
            assert {j.job_id: j.version for j in got.jobs} == {"job-r": 3}

        await assert_eventually_async(lambda: caught_up(backup.address, PRIMARY), timeout=30)
        for turn in range(2):
            again = procs.launch("services.paramserver", f"ps-p-{turn}", "--node-id", "ps-p",
                                 *primary_args, "--port", port)  # fmt: skip
            address = again.address
            await assert_eventually_async(lambda: caught_up(address, BACKUP), timeout=30)  # noqa: B023
            again.kill()


async def test_a_backup_restarted_while_the_job_is_idle_is_caught_up(cluster_procs):
    # No commit follows the restart, so no replication error tells the primary; its
    # link still counts the job as in sync on that address. The leader sees the new
    # process by its instance id, behind the primary, and has it added again.
    procs = cluster_procs
    coord = procs.coordinator("c1")
    await wait_leader(coord.address)
    join = ("--coordinator", coord.address)
    backup, primary, _ = pair(procs, join)

    async with CoordinatorClient(coord.address) as client:
        await three_steps(client, primary.address, "job-i")
        await restart_backup(procs, backup, join, "job-i", 30)


async def test_a_new_leader_tells_a_primary_restarted_meanwhile(cluster_procs):
    # The leader and the primary die together; the primary comes back empty under its
    # id before the standby coordinator leads. The new leader never polled the old
    # process: it finds its instance stored with the group.
    procs = cluster_procs
    c1 = procs.coordinator("c1", *SLOW_DETECTION)
    await wait_leader(c1.address)
    c2 = procs.coordinator("c2", *SLOW_DETECTION)
    backup, primary, primary_args = pair(procs, ("--coordinator", f"{c1.address},{c2.address}"))
    port = primary.address.rsplit(":", 1)[1]

    async with CoordinatorClient([c1.address, c2.address]) as client:
        await three_steps(client, primary.address, "job-l")
        primary.kill()
        c1.kill()
        procs.launch("services.paramserver", "ps-p-again", "--node-id", "ps-p",
                     *primary_args, "--port", port)  # fmt: skip

        async def backup_promoted():
            got = await replica(backup.address)
            assert (got.role, got.epoch) == (PRIMARY, 2)
            assert {j.job_id: j.version for j in got.jobs} == {"job-l": 3}

        await assert_eventually_async(backup_promoted, timeout=60)
        assert (await wait_leader(c2.address)).epoch > 1


async def test_a_backup_restarted_while_the_leader_changes_is_caught_up(cluster_procs):
    # The leader and the backup die together and the backup comes back empty under its
    # id. The new leader never saw the old backup process, so it cannot tell the new
    # one is behind; the primary does, from the instance its replication stream opens
    # to, and installs the job again.
    procs = cluster_procs
    c1 = procs.coordinator("c1", *SLOW_DETECTION)
    await wait_leader(c1.address)
    c2 = procs.coordinator("c2", *SLOW_DETECTION)
    join = ("--coordinator", f"{c1.address},{c2.address}")
    backup, primary, _ = pair(procs, join)

    async with CoordinatorClient([c1.address, c2.address]) as client:
        await three_steps(client, primary.address, "job-b")
        await restart_backup(procs, backup, join, "job-b", 60, c1)
        assert (await wait_leader(c2.address)).epoch > 1
