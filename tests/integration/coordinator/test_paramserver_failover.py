"""A paramserver primary dies: the coordinator promotes its backup under a higher epoch."""

from __future__ import annotations

import time

import pytest

from stalwart.api import common, paramserver, paramserver_grpc
from stalwart.channel import open_channel
from stalwart.client import CoordinatorClient
from tests.helpers import assert_eventually_async
from tests.integration.coordinator.support import wait_leader

pytestmark = pytest.mark.timeout(180)


async def replica_status(address: str) -> paramserver.GetReplicaStatusResponse:
    async with open_channel(address) as channel:
        return await paramserver_grpc.ParamServerServiceStub(channel).GetReplicaStatus(
            paramserver.GetReplicaStatusRequest(), timeout=2
        )


async def test_primary_killed_backup_promoted(cluster):
    coord = cluster.coordinator("c1")
    await wait_leader(coord.address)
    join = ("--coordinator", coord.address)
    backup = cluster.paramserver("ps-b", "--role", "backup", *join)
    primary = cluster.paramserver("ps-p", "--role", "primary", "--backups", backup.address, *join)
    async with CoordinatorClient(coord.address) as client:

        async def both_polled():
            nodes = await client.all_nodes(common.NODE_ROLE_PARAMSERVER)
            roles = {n.node_id: n.replica_role for n in nodes}
            assert roles == {
                "ps-p": common.REPLICA_ROLE_PRIMARY,
                "ps-b": common.REPLICA_ROLE_BACKUP,
            }

        await assert_eventually_async(both_polled, timeout=30)
        killed = time.monotonic()
        primary.kill()

        async def promoted():
            status = await replica_status(backup.address)
            assert status.role == common.REPLICA_ROLE_PRIMARY and status.epoch == 2

        await assert_eventually_async(promoted, timeout=10)
        print(f"\nbackup promoted {time.monotonic() - killed:.2f}s after kill -9 of the primary")
        async for event in client.watch_events():
            if event.kind == common.EVENT_KIND_REPLICA_PROMOTED:
                assert event.node_id == "ps-b" and event.attributes["epoch"] == "2"
                break
