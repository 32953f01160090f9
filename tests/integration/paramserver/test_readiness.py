"""Readiness follows the role: only a primary reports its service name SERVING.

A backup takes no client calls, so a readiness probe or a load balancer must not
send it any; the process itself is alive (the empty name) and still replicates.
"""

from __future__ import annotations

import pytest
from grpc_health.v1 import health_pb2

from tests.helpers import assert_eventually_async
from tests.integration.paramserver.support import health_status, promote, stubs

pytestmark = pytest.mark.timeout(120)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def _is(address: str, service: str | None, want: int) -> bool:
    status = await (health_status(address) if service is None else health_status(address, service))
    return status == want


async def test_backup_is_alive_but_not_ready_until_promoted(launcher) -> None:
    b = launcher.start("b", "--role", "backup")
    a = launcher.start("a", "--role", "primary", "--epoch", "1", "--backups", b.address)
    await assert_eventually_async(lambda: _is(a.address, None, SERVING))
    await assert_eventually_async(lambda: _is(b.address, None, NOT_SERVING))
    for replica in (a, b):  # both processes are alive
        assert await _is(replica.address, "", SERVING), replica.name

    async with stubs() as stub_for:
        assert (await promote(stub_for(b.address), epoch=2)).epoch == 2
    await assert_eventually_async(lambda: _is(b.address, None, SERVING))
