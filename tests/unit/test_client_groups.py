"""A call to every shard group ends together: the first group to fail cancels the
others before its error is raised (left running, a group's push retried through
failover for a minute after the caller had given up on the step)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from stalwart.api import common, paramserver
from stalwart.client.paramserver import ParamServerClient, ShardGroupClient
from stalwart.errors import RpcError


class _Group:
    def __init__(self, fails: bool):
        self.fails = fails
        self.cancelled = False

    async def pull(self, job_id, since_version, min_version, optimizer_state):
        if self.fails:
            raise RpcError(grpc.StatusCode.NOT_FOUND, "no job j")
        try:
            await asyncio.sleep(3600)  # retrying through a failover
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return 1, {}


def test_the_first_group_to_fail_cancels_the_others() -> None:
    waiting, failing = _Group(fails=False), _Group(fails=True)
    client = ParamServerClient([waiting, failing])

    async def scenario() -> bool:
        with pytest.raises(RpcError, match="no job j"):
            await client.pull("j")
        return waiting.cancelled  # already, not when the loop closes

    assert asyncio.run(scenario())


def _status(role: int, epoch: int) -> paramserver.GetReplicaStatusResponse:
    return paramserver.GetReplicaStatusResponse(role=role, epoch=epoch)


def test_a_primary_below_the_known_epoch_is_not_taken() -> None:
    # a deposed primary back from a partition still says primary, at its old epoch
    client = ShardGroupClient(["old:1", "new:1"], retry_for_s=0.1)
    statuses = {"old:1": _status(common.REPLICA_ROLE_PRIMARY, 3)}

    async def status(address: str):
        if address not in statuses:
            raise RpcError(grpc.StatusCode.UNAVAILABLE, "not up yet")
        return statuses[address]

    client.status = status
    client.follow("new:1", 4)  # the shard map names the promoted backup at 4
    with pytest.raises(RpcError, match="no primary at epoch 4"):
        asyncio.run(client.discover())
    assert client.epoch == 4  # not back to 3
    statuses["new:1"] = _status(common.REPLICA_ROLE_PRIMARY, 4)
    assert asyncio.run(client.discover()) == "new:1"
