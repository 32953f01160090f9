"""stalwart_coordinator_recoveries_total is the cluster's count, not one process's: the
count lives in the coordination store with the rest of the leader's state, so a leader
that crashes takes none of it along. Three coordinator processes on one store, each
leader killed with SIGKILL in turn; the leader_elected count goes on across them."""

from __future__ import annotations

import asyncio
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from stalwart.procs import ServiceProcess
from tests.helpers import assert_eventually_async
from tests.integration.coordinator.support import status_of, wait_leader

pytestmark = pytest.mark.timeout(240)

NAME = "stalwart_coordinator_recoveries_total"


def _recoveries(proc: ServiceProcess) -> dict[str, float]:
    """kind -> value of the recoveries counter on one process's /metrics."""
    url = f"http://127.0.0.1:{proc.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as answer:
        text = answer.read().decode()
    return {
        s.labels["kind"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == NAME
    }


async def _counted(proc: ServiceProcess, kind: str, want: float) -> None:
    async def check() -> None:
        got = await asyncio.to_thread(_recoveries, proc)
        assert got.get(kind) == want, f"{proc.name}: {got}"

    await assert_eventually_async(check, timeout=30)


async def _standby(proc: ServiceProcess) -> None:
    async def check() -> None:
        status = await status_of(proc.address)
        assert status is not None and not status.is_leader and status.leader_address

    await assert_eventually_async(check, timeout=30)


async def test_a_crashed_leaders_recoveries_stay_counted(cluster):
    metrics = ("--metrics-port", "0")
    first = cluster.coordinator("c1", *metrics)
    await wait_leader(first.address)
    await _counted(first, "leader_elected", 0)  # the store's first leader replaced nobody
    second = cluster.coordinator("c2", *metrics)
    await _standby(second)
    first.kill()
    await wait_leader(second.address)
    await _counted(second, "leader_elected", 1)

    third = cluster.coordinator("c3", *metrics)
    await _standby(third)
    # a standby exports no count: a sum over the coordinators counts each recovery once
    assert await asyncio.to_thread(_recoveries, third) == {}
    second.kill()
    await wait_leader(third.address)
    await _counted(third, "leader_elected", 2)  # the crashed leader's count carried on
    assert (await asyncio.to_thread(_recoveries, third)).keys() == {
        "trainer_replaced", "replica_promoted", "leader_elected",
        "checkpoint_restored", "node_drained",
    }  # fmt: skip
