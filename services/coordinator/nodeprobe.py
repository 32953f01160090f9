"""Declaring a silent trainer dead before its lease runs out, when it is provably gone.

A trainer heartbeats every ``heartbeat_interval_seconds``; its lease lasts
``node_lease_seconds``. Waiting out the lease is the only safe rule for a node
that may be paused or cut off (it could still be working). But a killed process
leaves proof behind: its port refuses connections. So once a trainer has missed
a couple of heartbeats, the leader asks its gRPC health service, with no
transparent retries and a short deadline. UNAVAILABLE (nothing listens there) →
dead now; any answer, or a deadline (paused, partitioned, overloaded) → the
lease decides as before.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import grpc
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.coordinator.control import Control
from services.coordinator.membership import Role

log = structlog.get_logger(__name__)

PROBE_TIMEOUT_S = 0.3
# Missed heartbeats before a trainer is probed: one late heartbeat is common on a
# loaded machine, two mean it is worth a look.
SILENT_HEARTBEATS = 2


class NodeProbe:
    def __init__(
        self,
        control: Control,
        channel: Callable[[str], grpc.aio.Channel],
        heartbeat_interval_s: float,
    ) -> None:
        """``channel(address)``: a cached channel without transparent retries."""
        self.control = control
        self._channel = channel
        self.silent_after_s = SILENT_HEARTBEATS * heartbeat_interval_s

    async def round(self) -> None:
        """Probe every silent trainer; declare dead those whose port refuses connections."""
        c = self.control
        async with c.lock:
            c.require_leader()
            silent = c.members.silent(time.time(), self.silent_after_s, Role.TRAINER)
            targets = [(n.node_id, n.address) for n in silent if n.address]
        if not targets:
            return
        refused = await asyncio.gather(*(self._refuses(address) for _, address in targets))
        async with c.lock:
            c.require_leader()
            now = time.time()
            # a trainer that spoke (or registered afresh) during the probe is not dead
            still = {n.node_id for n in c.members.silent(now, self.silent_after_s, Role.TRAINER)}
            died = False
            for (node_id, address), gone in zip(targets, refused, strict=True):
                node = c.members.nodes.get(node_id)
                if not gone or node_id not in still or node is None or node.address != address:
                    continue
                if c.members.declare_dead(node_id) is not None:
                    c._node_died(node, "missed heartbeats, port closed")
                    died = True
            if died:
                c._reconcile(now)
                await c._flush()

    async def _refuses(self, address: str) -> bool:
        stub = health_pb2_grpc.HealthStub(self._channel(address))
        try:
            await stub.Check(health_pb2.HealthCheckRequest(), timeout=PROBE_TIMEOUT_S)
        except grpc.RpcError as exc:
            return exc.code() is grpc.StatusCode.UNAVAILABLE
        return False
