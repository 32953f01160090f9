"""Paramserver replicas are compared by fingerprint at every checkpoint.

A bit flipped in one replica's parameters (a test-only fault keyed by version)
changes nothing on the wire; only the comparison sees it. With three replicas
the odd one is outvoted and quarantined, and leaves its group; with two, nobody
can say which is right, so the checkpoint is not published and the job goes
back to its newest agreed checkpoint. Either way the job ends bitwise equal to
the fault-free reference run.
"""

from __future__ import annotations

import asyncio

import pytest

from stalwart import training
from stalwart.api import common, coordinator, paramserver, paramserver_grpc
from stalwart.channel import open_channel
from stalwart.client import CoordinatorClient
from tests.helpers import assert_eventually_async
from tests.integration.trainer.support import assert_bitwise_equal, final_weights, small_spec

from .support import job_events, start_cluster, wait_job_done

pytestmark = pytest.mark.timeout(300)

SLOW = {"tr0": "delay_s=0.25", "tr1": "delay_s=0.25"}  # checkpoints land mid-job


def spec():
    return small_spec(steps=15, checkpoint_interval=3)


async def backups_of(address: str) -> list[str]:
    async with open_channel(address) as channel:
        stub = paramserver_grpc.ParamServerServiceStub(channel)
        status = await stub.GetReplicaStatus(paramserver.GetReplicaStatusRequest(), timeout=5)
    return [b.address for b in status.backups]


async def test_an_outvoted_backup_is_quarantined_and_leaves_its_group(cluster_procs):
    procs = cluster_procs
    job_spec = spec()
    training.make_deterministic()
    want = await asyncio.to_thread(training.reference_run, job_spec)
    faults = {**SLOW, "ps-b2": "flip_state_at_version=4"}
    coord, _, primary, backup = await start_cluster(procs, faults, backups=2)
    odd = next(p for p in procs.procs if p.name.endswith("-ps-b2"))

    async with CoordinatorClient(coord.address) as client:
        job = await client.create_job(job_spec, job_id="job-odd-backup")
        done = await wait_job_done(client, job.job_id, 200)
        assert done.state == coordinator.JOB_STATE_SUCCEEDED, done.reason
        nodes = {n.node_id: n for n in await client.all_nodes(common.NODE_ROLE_PARAMSERVER)}
        events = await job_events(client)

    assert "flip_state_at_version" in odd.log_tail(400)  # the fault really fired
    assert nodes["ps-b2"].state == coordinator.NODE_STATE_QUARANTINED
    assert nodes["ps-p"].state == nodes["ps-b"].state == coordinator.NODE_STATE_ALIVE
    quarantined = [e for e in events if e.kind == common.EVENT_KIND_NODE_QUARANTINED]
    assert [e.node_id for e in quarantined] == ["ps-b2"]
    assert "disagree" in quarantined[0].message
    caught_at = int(quarantined[0].message.split("at version ")[1].split()[0])
    assert caught_at > 4  # the first checkpoint after the flip (a multiple of 3, or a catch-up)
    saved = {e.step for e in events if e.kind == common.EVENT_KIND_CHECKPOINT_SAVED}
    assert caught_at in saved  # the primary was in the majority: its checkpoint stands
    assert not [e for e in events if e.kind == common.EVENT_KIND_CHECKPOINT_RESTORED]

    async def dropped():
        assert await backups_of(primary.address) == [backup.address]

    await assert_eventually_async(dropped, timeout=10)
    version, got = await final_weights([primary.address, backup.address], job.job_id, job_spec)
    assert version == job_spec.steps
    assert_bitwise_equal(got, want)


async def test_a_tie_is_not_published_and_the_job_goes_back_to_the_agreed_checkpoint(
    cluster_procs,
):
    procs = cluster_procs
    job_spec = spec()
    training.make_deterministic()
    want = await asyncio.to_thread(training.reference_run, job_spec)
    faults = {**SLOW, "ps-p": "flip_state_at_version=7"}
    coord, _, primary, backup = await start_cluster(procs, faults)

    async with CoordinatorClient(coord.address) as client:
        job = await client.create_job(job_spec, job_id="job-tie")
        done = await wait_job_done(client, job.job_id, 200)
        assert done.state == coordinator.JOB_STATE_SUCCEEDED, done.reason
        nodes = await client.all_nodes(common.NODE_ROLE_PARAMSERVER)
        events = await job_events(client)

    assert "flip_state_at_version" in primary.log_tail(400)
    assert all(n.state == coordinator.NODE_STATE_ALIVE for n in nodes)  # nobody to blame
    detected = [e for e in events if e.kind == common.EVENT_KIND_CORRUPTION_DETECTED]
    assert len(detected) == 1 and "disagree" in detected[0].message
    mismatch = detected[0].step
    assert mismatch > 7 and mismatch % 3 == 0
    restored = [e for e in events if e.kind == common.EVENT_KIND_CHECKPOINT_RESTORED]
    assert len(restored) == 1 and restored[0].step < 7  # the newest checkpoint before the flip
    assert restored[0].sequence > detected[0].sequence
    # the disagreeing snapshot was never published; only the recomputed one may be
    saved = [e for e in events if e.kind == common.EVENT_KIND_CHECKPOINT_SAVED]
    assert all(e.sequence > restored[0].sequence for e in saved if e.step == mismatch)
    agreed = [e for e in saved if e.step == restored[0].step]
    assert agreed and agreed[0].sequence < detected[0].sequence  # saved before the flip
    version, got = await final_weights([primary.address, backup.address], job.job_id, job_spec)
    assert version == job_spec.steps
    assert_bitwise_equal(got, want)  # recomputed from the agreed checkpoint
