"""A node session on a thread of its own keeps heartbeating while the loop that
started it is blocked (a trainer computing a step on its loop), and hands every
answer to that loop."""

from __future__ import annotations

import asyncio
import threading
import time

import grpc
import pytest

from stalwart.api import common, coordinator, coordinator_grpc
from stalwart.client import CoordinatorClient, NodeSession
from stalwart.client.sessionthread import SessionThread
from tests.integration.coordinator.support import wait_leader
from tests.integration.coordinator.test_node_probe import _closed_port_address

pytestmark = pytest.mark.timeout(120)

# Beats every 0.1 s; the default 3 s floor before a silent node is dead, so a
# starved machine's late beat fails nothing. Renewals are what the test counts.
FAST_BEATS = ("--heartbeat-interval-seconds", "0.1")
RENEWALS = 8  # lease renewals the blocked loop must see, about 8 beats' time


def _renewals_while_blocked(address: str, node_id: str, deadline_s: float) -> list:
    """Block the calling thread (and so its event loop) until the node's lease was
    renewed RENEWALS times; the node's states seen meanwhile."""
    seen_expiries, states = set(), []
    with grpc.insecure_channel(address) as channel:
        stub = coordinator_grpc.CoordinatorServiceStub(channel)
        deadline = time.monotonic() + deadline_s
        while len(seen_expiries) < RENEWALS and time.monotonic() < deadline:
            nodes = stub.ListNodes(coordinator.ListNodesRequest(), timeout=5).nodes
            node = next(n for n in nodes if n.node_id == node_id)
            seen_expiries.add(node.lease_expire_time.ToNanoseconds())
            states.append(node.state)
    assert len(seen_expiries) >= RENEWALS, f"{len(seen_expiries)} renewals in {deadline_s}s"
    return states


async def test_heartbeats_go_on_while_the_owners_loop_is_blocked(cluster):
    coord = cluster.coordinator("c1", *FAST_BEATS)
    await wait_leader(coord.address)
    answers: list[tuple[int, coordinator.HeartbeatResponse]] = []
    client = CoordinatorClient(coord.address, blocking=True)
    # an answering port (the coordinator's own): only silence could make it dead
    session = NodeSession(client, common.NODE_ROLE_TRAINER, coord.address, node_id="t")
    beats = SessionThread(session, lambda r: answers.append((threading.get_ident(), r)))
    await beats.start()
    thread = beats._thread
    try:
        session.step = 7
        # A beat answered before start() returned may have been handed over already.
        before = len(answers)
        states = _renewals_while_blocked(coord.address, "t", deadline_s=30.0)
        assert set(states) == {coordinator.NODE_STATE_ALIVE}
        assert len(answers) == before  # nothing ran on the blocked loop
        for _ in range(200):  # the answers queued meanwhile now run here, on this loop
            if len(answers) > before:
                break
            await asyncio.sleep(0.05)
        assert len(answers) > before
        assert {ident for ident, _ in answers} == {threading.get_ident()}
        async with CoordinatorClient(coord.address) as reader:
            node = next(n for n in await reader.all_nodes() if n.node_id == "t")
        assert node.state == coordinator.NODE_STATE_ALIVE
    finally:
        await beats.stop()
    assert thread is not None and not thread.is_alive()


async def test_a_registration_that_fails_is_raised_by_start():
    client = CoordinatorClient(_closed_port_address(), blocking=True, retry_for_s=0.5)
    session = NodeSession(client, common.NODE_ROLE_TRAINER, "127.0.0.1:1", register_timeout_s=2.0)
    beats = SessionThread(session, lambda _r: None)
    with pytest.raises(Exception) as info:  # noqa: PT011 - RpcError or TimeoutError
        await beats.start()
    assert "UNAVAILABLE" in str(info.value) or isinstance(info.value, TimeoutError)
    thread = beats._thread
    assert thread is not None
    await asyncio.to_thread(thread.join)  # the thread ends on its own, its loop closed
    await beats.stop()  # and stop() after it still returns


async def test_a_session_thread_needs_a_blocking_client():
    session = NodeSession(CoordinatorClient("127.0.0.1:1"), common.NODE_ROLE_TRAINER, "x:1")
    with pytest.raises(ValueError, match="blocking"):
        SessionThread(session, lambda _r: None)
