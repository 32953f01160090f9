"""GetClusterStatus counts nodes by one rule whichever replica answers: the leader from
memory, a standby replica from the store. They used to differ (a drained or
quarantined node counted by the leader only), so the count moved with a failover."""

from __future__ import annotations

import pytest

from stalwart.api import common
from stalwart.client import CoordinatorClient, NodeSession
from tests.helpers import assert_eventually_async
from tests.integration.coordinator.support import wait_leader

pytestmark = pytest.mark.timeout(240)


async def test_leader_and_standby_replica_count_the_same_nodes(cluster):
    c1 = cluster.coordinator("c1")
    await wait_leader(c1.address)
    c2 = cluster.coordinator("c2")
    async with CoordinatorClient([c1.address, c2.address]) as client:
        sessions = [
            NodeSession(client, common.NODE_ROLE_TRAINER, f"127.0.0.1:{port}", node_id=name)
            for name, port in (("a", 5), ("d", 6), ("q", 7))
        ]
        for session in sessions:
            await session.start()
        try:
            await client.drain_node("d", reason="maintenance")
            await client.report_corruption("q", "q", "abft", message="checksum")
            leader = (await client.cluster_status()).leader_address
            standby = c2.address if leader == c1.address else c1.address

            async def both_say_three():
                for session in sessions:
                    await session.beat()
                said = [(await client.replica_status(a)).nodes_alive for a in (leader, standby)]
                assert said == [3, 3], f"leader, standby: {said}"

            await assert_eventually_async(both_say_three, timeout=30)
        finally:
            for session in sessions:
                await session.stop()
