"""Hangs that no lease catches, with real processes.

A trainer that hangs mid-job and goes on heartbeating is drained by the leader as
hung: the primary's status shows its slot's push missing while the step stands
still. The warm standby takes the slot. A primary whose commit wedges (every push of
the step in, its server still answering) loses its group to its backup. Both jobs
finish bitwise equal to the fault-free reference run."""

from __future__ import annotations

import asyncio

import pytest

from stalwart import training
from stalwart.api import common, coordinator
from stalwart.client import CoordinatorClient
from tests.integration.coordinator.support import wait_leader
from tests.integration.sdc.support import job_events

from .support import (
    assert_bitwise_equal,
    coordinated_paramservers,
    final_weights,
    small_spec,
    wait_trainers,
)
from .test_trainer_with_coordinator import wait_job_done

pytestmark = pytest.mark.timeout(300)

HANG_AT = 5
HUNG_STEP_S = "6"  # the leader's limit here (300 s by default): far above a step even under load


async def test_a_hung_trainer_is_drained_and_its_standby_finishes_bitwise(cluster_procs):
    procs = cluster_procs
    spec = small_spec(steps=12)
    training.make_deterministic()
    want = await asyncio.to_thread(training.reference_run, spec)

    join, (primary, backup) = await coordinated_paramservers(
        procs, "--hung-step-seconds", HUNG_STEP_S
    )
    procs.trainer("tr0", *join)
    hung = procs.trainer("tr1", *join, faults=f"hang_at_step={HANG_AT}")
    procs.trainer("sb", *join, "--standby")

    async with CoordinatorClient(join[1]) as client:
        await wait_trainers(client, {"tr0", "tr1", "sb"}, 30)
        job = await client.create_job(spec, job_id="job-hung")
        done = await wait_job_done(client, job.job_id, 180)
        assert done.state == coordinator.JOB_STATE_SUCCEEDED, done.reason
        events = await job_events(client)
        nodes = {n.node_id: n for n in await client.all_nodes(common.NODE_ROLE_TRAINER)}

    assert hung.alive()  # never killed: alive and heartbeating all along
    assert "fault fired" in hung.log_tail(200)
    assert nodes["tr1"].state == coordinator.NODE_STATE_DRAINED
    assert nodes["tr0"].state == coordinator.NODE_STATE_ALIVE  # it had pushed: not blamed
    drained = [e for e in events if e.kind == common.EVENT_KIND_NODE_DRAINED]
    assert [e.node_id for e in drained] == ["tr1"]
    reason = drained[0].attributes["reason"]
    assert reason.startswith(f"hung: no push for slot 1 of job-hung at step {HANG_AT} in "), reason
    promoted = [e for e in events if e.kind == common.EVENT_KIND_STANDBY_PROMOTED]
    assert [(e.node_id, e.step) for e in promoted] == [("sb", HANG_AT)], promoted
    version, got = await final_weights([primary.address, backup.address], job.job_id, spec)
    assert version == spec.steps
    assert_bitwise_equal(got, want)


async def test_a_wedged_primary_loses_its_group_to_its_backup_bitwise(cluster_procs):
    procs = cluster_procs
    spec = small_spec(steps=12)
    training.make_deterministic()
    want = await asyncio.to_thread(training.reference_run, spec)

    coord = procs.coordinator("c1", "--hung-step-seconds", HUNG_STEP_S)
    await wait_leader(coord.address)
    join = ("--coordinator", coord.address)
    backup = procs.start("services.paramserver", "ps-b", "--role", "backup", *join)
    wedged = procs.start("services.paramserver", "ps-p", "--role", "primary",
                         "--backups", backup.address, *join,
                         env={"STALWART_FAULTS": f"hang_commit_at_version={HANG_AT}"})  # fmt: skip
    for name in ("tr0", "tr1"):
        procs.trainer(name, *join)

    async with CoordinatorClient(coord.address) as client:
        await wait_trainers(client, {"tr0", "tr1"}, 30)
        job = await client.create_job(spec, job_id="job-wedged")
        done = await wait_job_done(client, job.job_id, 180)
        assert done.state == coordinator.JOB_STATE_SUCCEEDED, done.reason
        events = await job_events(client)

    assert wedged.alive() and "fault fired" in wedged.log_tail(400)
    promoted = [e for e in events if e.kind == common.EVENT_KIND_REPLICA_PROMOTED]
    assert [(e.node_id, e.attributes["previous"]) for e in promoted] == [("ps-b", "ps-p")]
    version, got = await final_weights([backup.address], job.job_id, spec)
    assert version == spec.steps
    assert_bitwise_equal(got, want)
