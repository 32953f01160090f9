"""UndrainNode over gRPC: a drained trainer returns to service and gets its slot back."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from pathlib import Path

import pytest

from stalwart.api import common, coordinator
from stalwart.client import CoordinatorClient, NodeSession
from stalwart.errors import ErrorKind, RpcError
from tests.integration.coordinator.support import job_spec, wait_leader

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[3]


async def beat_until(session: NodeSession, done, tries: int = 100) -> None:
    for _ in range(tries):  # heartbeats carry the directions: poll them, up to ~5 s
        await session.beat()
        if done(session):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never reached: assignment {session.assignment}")


def holds_slot(session: NodeSession) -> bool:
    return session.assignment is not None and not session.assignment.standby


@contextlib.asynccontextmanager
async def slot_trainer(cluster, node_id: str, port: int):
    """A leader, a client of it, a one-slot job and a trainer ``node_id`` holding it."""
    c = cluster.coordinator("c1")
    await wait_leader(c.address)
    async with CoordinatorClient(c.address) as client:
        job = await client.create_job(job_spec(num_slots=1))
        worker = NodeSession(client, common.NODE_ROLE_TRAINER, f"127.0.0.1:{port}", node_id=node_id)
        await worker.start()
        try:
            await beat_until(worker, holds_slot)
            assert worker.assignment.job_id == job.job_id
            yield client, job, worker
        finally:
            await worker.stop()


async def test_a_drained_trainer_undrained_gets_work_again(cluster):
    async with slot_trainer(cluster, "w", 1) as (client, job, worker):
        drained = await client.drain_node("w", reason="maintenance")
        draining = (coordinator.NODE_STATE_DRAINING, coordinator.NODE_STATE_DRAINED)
        assert drained.state in draining
        await beat_until(worker, lambda s: s.assignment is None)
        nodes = {n.node_id: n for n in await client.all_nodes()}
        assert nodes["w"].state == coordinator.NODE_STATE_DRAINED

        back = await client.undrain_node("w", request_id="undrain-1")
        assert back.state == coordinator.NODE_STATE_ALIVE
        await beat_until(worker, holds_slot)
        assert worker.assignment.job_id == job.job_id and worker.assignment.slot == 0

        again = await client.undrain_node("w")  # in service already: answered as it is
        assert again.state == coordinator.NODE_STATE_ALIVE
        kinds = []
        async for event in client.watch_events():
            kinds.append(event.kind)
            if event.kind == common.EVENT_KIND_NODE_UNDRAINED:
                assert event.node_id == "w" and "was drained" in event.message
                break
        assert common.EVENT_KIND_NODE_DRAINED in kinds

        with pytest.raises(RpcError) as info:
            await client.undrain_node("no-such-node")
        assert info.value.kind is ErrorKind.NOT_FOUND


async def test_a_dead_node_is_not_undrained(cluster):
    c = cluster.coordinator(
        "c1", "--node-lease-seconds", "0.6", "--heartbeat-interval-seconds", "0.1"
    )
    await wait_leader(c.address)
    async with CoordinatorClient(c.address) as client:
        gone = NodeSession(client, common.NODE_ROLE_TRAINER, "127.0.0.1:3", node_id="gone")
        await gone.start()
        await gone.beat()
        await client.drain_node("gone")
        await gone.stop()  # falls silent: its lease lapses
        for _ in range(100):
            nodes = {n.node_id: n for n in await client.all_nodes()}
            if nodes["gone"].state == coordinator.NODE_STATE_DEAD:
                break
            await asyncio.sleep(0.05)
        with pytest.raises(RpcError) as info:
            await client.undrain_node("gone")
        assert info.value.kind is ErrorKind.FAILED_PRECONDITION
        assert "is dead" in info.value.message


async def test_a_quarantined_trainer_comes_back_only_when_released(cluster):
    """Corrupt numbers came from it: undrain alone refuses, with the flag to use; with
    release_quarantine it is ALIVE and given its slot again, and says so in an event."""
    async with slot_trainer(cluster, "q", 4) as (client, job, worker):
        state = await client.report_corruption("q", "q", "abft", job.job_id, 3, "checksum")
        assert state == coordinator.NODE_STATE_QUARANTINED
        await beat_until(worker, lambda s: s.assignment is None)

        with pytest.raises(RpcError) as info:
            await client.undrain_node("q")
        assert info.value.kind is ErrorKind.FAILED_PRECONDITION
        assert "is quarantined" in info.value.message
        assert "--release-quarantine" in info.value.message
        nodes = {n.node_id: n for n in await client.all_nodes()}
        assert nodes["q"].state == coordinator.NODE_STATE_QUARANTINED  # nothing applied

        back = await client.undrain_node("q", release_quarantine=True)
        assert back.state == coordinator.NODE_STATE_ALIVE
        await beat_until(worker, holds_slot)
        assert worker.assignment.job_id == job.job_id
        async for event in client.watch_events():
            if event.kind == common.EVENT_KIND_NODE_UNDRAINED:
                assert event.node_id == "q" and "was quarantined" in event.message
                break


async def test_only_trainers_are_drained(cluster):
    """Draining marked a paramserver DRAINING and changed nothing else: refused now."""
    c = cluster.coordinator("c1")
    await wait_leader(c.address)
    async with CoordinatorClient(c.address) as client:
        ps = NodeSession(client, common.NODE_ROLE_PARAMSERVER, "127.0.0.1:5", node_id="ps")
        await ps.start()
        try:
            with pytest.raises(RpcError) as info:
                await client.drain_node("ps", reason="maintenance")
            assert info.value.kind is ErrorKind.FAILED_PRECONDITION
            assert "is a paramserver: only trainers are drained" in info.value.message
            nodes = {n.node_id: n for n in await client.all_nodes()}
            assert nodes["ps"].state == coordinator.NODE_STATE_ALIVE  # nothing applied
        finally:
            await ps.stop()


async def test_draining_the_last_trainer_says_its_slot_waits(cluster):
    """`stalwart drain` of a job's only trainer: the table, and a note that the slot has
    no trainer now (it used to look like any other drain)."""
    async with slot_trainer(cluster, "last", 6) as (client, job, _):
        address = client.addresses[0]
        shown = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "stalwart.cli.main", "drain", "last", "-c", address],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        assert "last" in shown.stdout
        assert f"note: job {job.job_id} has no trainer for slot(s) 0 now" in shown.stderr
        assert "stalwart undrain last" in shown.stderr
