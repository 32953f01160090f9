"""Leader failover with the coordination store on Apache Ignite (a real node): the
lease lapses, the standby takes over with the stored jobs, as on shm and Redis."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.backends import ignite_url  # noqa: F401
from tests.integration.coordinator.conftest import Cluster
from tests.integration.coordinator.test_leader_failover import TTL_S, _failover_after_kill

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def ignite_cluster(run_dir: Path, ignite_url: str) -> Iterator[Cluster]:  # noqa: F811
    c = Cluster(run_dir, ignite_url)
    try:
        yield c
    finally:
        c.stop_all()


async def test_kill_leader_on_ignite(ignite_cluster):
    # like Redis, no process-bound lock: the lease must lapse (its TTL) first
    await _failover_after_kill(ignite_cluster, limit_s=TTL_S + 2.0)
