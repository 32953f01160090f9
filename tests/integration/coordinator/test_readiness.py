"""Readiness follows leadership: only the leader reports its service name SERVING.

A standby answers every client call with NOT_LEADER, so a readiness probe (and
the Kubernetes Service behind it) must route to the leader alone; liveness (the
empty name) is SERVING on every replica that runs.
"""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from stalwart.channel import open_channel
from tests.helpers import assert_eventually_async
from tests.integration.coordinator.support import wait_leader

pytestmark = pytest.mark.timeout(120)

SERVICE = "stalwart.v1.CoordinatorService"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def _status(address: str, service: str) -> int | None:
    async with open_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            request = health_pb2.HealthCheckRequest(service=service)
            return (await stub.Check(request, timeout=2)).status
        except grpc.RpcError:
            return None


async def _is(address: str, service: str, want: int) -> bool:
    return await _status(address, service) == want


async def test_only_the_leader_is_ready_and_a_successor_becomes_ready(cluster) -> None:
    leader = cluster.coordinator("c1")
    await wait_leader(leader.address)
    standby = cluster.coordinator("c2")
    await assert_eventually_async(lambda: _is(leader.address, SERVICE, SERVING))
    await assert_eventually_async(lambda: _is(standby.address, "", SERVING))
    assert await _status(standby.address, SERVICE) == NOT_SERVING

    leader.kill()
    await wait_leader(standby.address)
    await assert_eventually_async(lambda: _is(standby.address, SERVICE, SERVING))
