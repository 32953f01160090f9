"""A call to every shard group ends together: the first group to fail cancels the
others before its error is raised (left running, a group's push retried through
failover for a minute after the caller had given up on the step)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from stalwart.client.paramserver import ParamServerClient
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
