"""A node that outlives its cluster's store: the coordinators come back on the same
addresses over an empty store (``stalwart down`` / ``up`` on fixed ports, a store
wiped under a live cluster), so the node holds a coordinator epoch the new leader
never issued. It must take the leader's epoch from the UNKNOWN_EPOCH answer,
register again and go on beating, not be refused forever."""

from __future__ import annotations

import pytest

from stalwart.api import common, coordinator
from stalwart.client import CoordinatorClient
from stalwart.client.coordinator import NodeSession
from tests.helpers import assert_eventually_async
from tests.integration.coordinator.support import wait_leader

pytestmark = pytest.mark.timeout(240)


def _port(address: str) -> str:
    return address.rsplit(":", 1)[1]


async def _alive_at(addresses: list[str], node_id: str) -> coordinator.Node:
    """The leader's record of ``node_id``; AssertionError unless it is there and ALIVE."""
    async with CoordinatorClient(addresses, call_timeout_s=2.0, retry_for_s=2.0) as client:
        nodes = await client.all_nodes()
    alive = [n for n in nodes if n.node_id == node_id and n.state == coordinator.NODE_STATE_ALIVE]
    assert alive, f"{node_id} is not alive at the leader: {[n.node_id for n in nodes]}"
    return alive[0]


async def test_node_holding_an_epoch_the_new_store_never_issued_registers_again(cluster):
    first = cluster.coordinator("c1")
    await wait_leader(first.address)
    second = cluster.coordinator("c2")
    addresses = [first.address, second.address]
    async with CoordinatorClient(addresses) as admin:
        await admin.step_down()  # the standby takes over: epoch 2
        status = await wait_leader(second.address)
    assert status.epoch == 2

    client = CoordinatorClient(addresses, retry_for_s=2.0)
    session = NodeSession(client, common.NODE_ROLE_HEALTH, "127.0.0.1:1", node_id="health")
    try:
        await session.start()
        assert session.epoch == 2

        # The cluster goes down and comes back on the same ports over an empty store
        # (a new key prefix: nothing of the old cluster, its epochs included, is there).
        first.terminate(), second.terminate()
        cluster.prefix += "b"
        again = cluster.coordinator("c1", "--port", _port(first.address))
        fresh = await wait_leader(again.address)
        cluster.coordinator("c2", "--port", _port(second.address))
        assert fresh.epoch == 1 and again.address == first.address

        node = await assert_eventually_async(
            lambda: _alive_at(addresses, "health"), timeout=30,
            message="the node is alive in the new leader's membership",
        )  # fmt: skip
        assert node.address == "127.0.0.1:1"
        assert session.epoch == 1 and client.epoch == 1  # ReportGradient carries the latter
        beats = session.dropped
        accepted = await assert_eventually_async(session.beat, timeout=10)
        assert accepted.epoch == 1 and session.dropped == beats
    finally:
        await session.stop()
        await client.close()
