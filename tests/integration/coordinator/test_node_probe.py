"""A silent trainer whose port refuses connections is dead before its lease ends;
a silent one that still answers keeps its lease (it may be paused or slow)."""

from __future__ import annotations

import socket

import pytest

from stalwart.api import common, coordinator
from stalwart.client import CoordinatorClient
from tests.helpers import assert_eventually_async
from tests.integration.coordinator.support import wait_leader

pytestmark = pytest.mark.timeout(120)

# A lease far longer than the test waits: only the probe can declare a node dead here.
LONG_LEASE = ("--node-lease-seconds", "60", "--heartbeat-interval-seconds", "0.2")


def _closed_port_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"  # nothing listens once it is closed


async def _state(client: CoordinatorClient, node_id: str) -> int:
    nodes = {n.node_id: n for n in await client.all_nodes()}
    return nodes[node_id].state


async def test_a_silent_trainer_on_a_refusing_port_is_declared_dead_before_its_lease(cluster):
    coord = cluster.coordinator("c1", *LONG_LEASE)
    await wait_leader(coord.address)
    async with CoordinatorClient(coord.address) as client:
        await client.register_node(common.NODE_ROLE_TRAINER, _closed_port_address(), node_id="gone")

        async def dead():
            assert await _state(client, "gone") == coordinator.NODE_STATE_DEAD

        await assert_eventually_async(dead, timeout=20, interval=0.1)
        events = [e async for e in _replayed(client)]
    died = [e.message for e in events if e.kind == common.EVENT_KIND_NODE_DEAD]
    assert died == ["trainer gone dead: missed heartbeats, port closed"]


async def test_a_silent_trainer_that_still_answers_keeps_its_lease(cluster):
    coord = cluster.coordinator("c1", *LONG_LEASE)
    await wait_leader(coord.address)
    async with CoordinatorClient(coord.address) as client:
        # the coordinator's own port serves the health service: an answering node
        await client.register_node(common.NODE_ROLE_TRAINER, coord.address, node_id="quiet")
        gone = _closed_port_address()
        await client.register_node(common.NODE_ROLE_TRAINER, gone, node_id="gone")

        async def gone_dead():
            assert await _state(client, "gone") == coordinator.NODE_STATE_DEAD

        # by the time the refusing one is dead, the answering one was probed as well
        await assert_eventually_async(gone_dead, timeout=20, interval=0.1)
        assert await _state(client, "quiet") == coordinator.NODE_STATE_ALIVE


async def _replayed(client: CoordinatorClient):
    """The stored events so far (the replay at the start of a watch), then stop."""
    async for event in client.watch_events():
        yield event
        if event.kind == common.EVENT_KIND_NODE_DEAD:
            return
