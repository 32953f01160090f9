"""SIGSTOP, not kill -9: a paused process is slow, not dead, and fails no job.

- The coordinator leader paused mid-job: the standby takes the lease,
  nobody is declared dead (the new leader gives every node a full detection
  window, and the nodes' heartbeats reach it at once), a watcher's event stream
  moves to the new leader while the old one is still stopped, the job succeeds
  and its weights equal a fault-free run bit for bit.
- The only in-sync backup paused: the primary stops waiting for it within the
  bounded replication wait, the coordinator installs the warm spare as backup,
  and steps go on while the backup is still stopped.
- The primary paused: its lease runs out, the backup is promoted, and the pushes
  that were waiting on the stopped primary are sent to the new one as soon as the
  trainers see the new shard map, so steps go on while the old primary is still
  stopped, well before those pushes' deadline.

The tests share one cluster (conftest.py's ``local``, started again for this
module, with the default warm spare).
"""

from __future__ import annotations

import asyncio

import pytest

from stalwart import cluster
from stalwart.api import coordinator
from stalwart.client.coordinator import CoordinatorClient
from tests.integration.cluster.support import (
    JOB_TIMEOUT_S,
    assert_bitwise_equal,
    finish_and_pull,
    reference,
    small_spec,
    watched_job,
)

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.timeout(420)]

# What the stopped backup must let happen before it is resumed: steps committed
# while it cannot answer. Held stopped at least this long, and until then.
BACKUP_PAUSE_MIN_S = 6.0
STEPS_WHILE_PAUSED = 3
# A stopped primary is held at most this long: under the trainers' call deadline
# (services/trainer/settings.py, 30 s), which is how long pushes waiting on it
# took to move on before they followed the promoted backup.
PRIMARY_PAUSE_MAX_S = 20.0
# A stopped leader: at least long enough for its lease to pass to the standby, then
# until the watcher has seen steps the successor announced, for at most 20 s more
# (a stream on the stopped leader would wait for gRPC's keepalive, 40 s).
LEADER_PAUSE_MIN_S = 4.0
LEADER_HOLD_MAX_S = 20.0


async def _target(kind: str, local: cluster.LocalCluster, client, job_id: str) -> str:
    if kind == "coordinator":
        status = await client.cluster_status()
        return local.by_address(status.leader_address).name
    if kind == "primary":
        group = (await client.get_shard_map(job_id)).groups[0]
        return local.by_address(group.primary_address).name
    for _ in range(300):  # the primary may still be installing its backup
        group = (await client.get_shard_map(job_id)).groups[0]
        if group.backup_addresses:
            return local.by_address(group.backup_addresses[0]).name
        await asyncio.sleep(0.2)
    raise AssertionError(f"{job_id}'s shard group has no backup")


async def _run_paused(
    local: cluster.LocalCluster, spec, kind: str, pause_s: float, hold_s: float = 90.0
):
    """Run ``spec``; at step 10 SIGSTOP the ``kind`` member for ``pause_s``, then until
    ``STEPS_WHILE_PAUSED`` steps have committed or ``hold_s`` more has passed; return
    what happened."""
    async with (
        CoordinatorClient(local.coordinator_addresses, retry_for_s=60.0) as client,
        watched_job(client, spec) as (job, recorder),
    ):
        assert await recorder.wait_step(10, JOB_TIMEOUT_S), "job never got to step 10"
        name = await _target(kind, local, client, job.job_id)
        started = len(recorder.events)
        await asyncio.to_thread(local.pause, name)
        paused_at = recorder.step
        try:
            await asyncio.sleep(pause_s)
            progressed = await recorder.wait_step(paused_at + STEPS_WHILE_PAUSED, hold_s)
        finally:
            await asyncio.to_thread(local.resume, name)
        stepped_while_paused = recorder.step - paused_at
        job, version, weights = await finish_and_pull(client, job, spec)
    events = recorder.events[started:]
    return job, version, weights, events, name, progressed, stepped_while_paused


def test_paused_leader_declares_nobody_dead_and_fails_no_job(local):
    spec = small_spec(steps=60, seed=7)
    job, version, weights, events, paused, progressed, stepped = asyncio.run(
        _run_paused(local, spec, "coordinator", LEADER_PAUSE_MIN_S, hold_s=LEADER_HOLD_MAX_S)
    )
    assert progressed, (
        f"the watcher saw {stepped} steps while {paused} was stopped: its event stream "
        "stayed on the stopped leader"
    )
    assert job.state == coordinator.JOB_STATE_SUCCEEDED, job.reason
    assert version == spec.steps
    assert any(e.kind == "LEADER_ELECTED" for e in events), "the standby never took over"
    dead = [e.message for e in events if e.kind == "NODE_DEAD"]
    assert dead == [], f"live nodes declared dead while {paused} was paused: {dead}"
    assert_bitwise_equal(weights, reference(spec))


def test_paused_backup_is_replaced_by_the_spare_and_steps_go_on(local):
    spec = small_spec(steps=60, seed=8)
    job, version, weights, _, paused, progressed, stepped = asyncio.run(
        _run_paused(local, spec, "backup", BACKUP_PAUSE_MIN_S)
    )
    assert progressed, f"only {stepped} steps committed while {paused} was stopped"
    assert job.state == coordinator.JOB_STATE_SUCCEEDED, job.reason
    assert version == spec.steps
    assert_bitwise_equal(weights, reference(spec))


def test_paused_primary_is_replaced_and_the_pushes_waiting_on_it_follow(local):
    spec = small_spec(steps=60, seed=9)
    job, version, weights, events, paused, progressed, stepped = asyncio.run(
        _run_paused(local, spec, "primary", 0.0, hold_s=PRIMARY_PAUSE_MAX_S)
    )
    assert any(e.kind == "REPLICA_PROMOTED" for e in events), f"{paused} was never replaced"
    assert progressed, (
        f"only {stepped} steps committed in the {PRIMARY_PAUSE_MAX_S:.0f} s {paused} was "
        "stopped: the pushes waiting on it did not follow the promoted backup"
    )
    assert job.state == coordinator.JOB_STATE_SUCCEEDED, job.reason
    assert version == spec.steps
    assert_bitwise_equal(weights, reference(spec))
