"""The coordinator's link to the health service (``--health host:port``, optional).

- WatchAlerts: an alert that asks for a drain about a live trainer whose risk is
  at or above ``health_drain_risk`` drains it at once: placement moves its slot
  to a warm standby before the node fails.
- ListNodeRisks, polled: every node's health score (1 - risk) feeds placement
  (best first by health score), and a risky trainer whose alert was missed while
  the watch reconnected is drained all the same.
- RaiseAlert: corruption the coordinator caught becomes a DATA_CORRUPTION alert.

Acts only while this replica leads (NOT_LEADER is ignored: the leader acts).
"""

from __future__ import annotations

import asyncio
import contextlib

import grpc
import structlog

from services.coordinator import drain
from services.coordinator.membership import Role
from stalwart.api import health, health_grpc
from stalwart.errors import StalwartError

log = structlog.get_logger(__name__)

CALL_TIMEOUT_S = 2.0
RECONNECT_S = 1.0


def should_drain(node, risk: float, drain_risk: float) -> bool:
    """A live trainer at or above the drain risk (pure; drain.py has the state rule)."""
    if node is None or node.role is not Role.TRAINER:
        return False
    return drain.should_drain_for_health(node.state, 1.0 - risk, 1.0 - drain_risk + 1e-12)


class HealthWatch:
    def __init__(self, control, channel: grpc.aio.Channel, drain_risk: float, poll_s: float):
        self.control = control
        self.stub = health_grpc.HealthMonitorServiceStub(channel)
        self.drain_risk = drain_risk
        self.poll_s = poll_s

    async def run(self) -> None:
        await asyncio.gather(self._watch_forever(), self._poll_forever())

    async def raise_alert(self, node_id: str, message: str) -> None:
        await self.stub.RaiseAlert(
            health.RaiseAlertRequest(kind=health.ALERT_KIND_DATA_CORRUPTION, node_id=node_id,
                                     message=message),
            timeout=CALL_TIMEOUT_S,
        )  # fmt: skip

    async def _watch_forever(self) -> None:
        while True:
            try:
                stream = self.stub.WatchAlerts(health.WatchAlertsRequest(min_risk=0.0))
                async for response in stream:
                    await self._on_alert(response.alert)
            except grpc.RpcError as err:
                log.debug("health watch broke; reconnecting", error=str(err))
            await asyncio.sleep(RECONNECT_S)

    async def _on_alert(self, alert: health.Alert) -> None:
        if not alert.drain:
            return
        await self._maybe_drain(alert.node_id, alert.risk, alert.message)

    async def _maybe_drain(self, node_id: str, risk: float, why: str) -> None:
        if not self.control.epoch:
            return  # a standby coordinator: the leader acts
        node = self.control.members.nodes.get(node_id)
        if not should_drain(node, risk, self.drain_risk):
            return
        log.warning("draining a node the health service expects to fail",
                    node=node_id, risk=round(risk, 3), why=why)  # fmt: skip
        with contextlib.suppress(StalwartError):  # NOT_LEADER, or gone meanwhile
            await self.control.drain_node(
                node_id,
                f"health service predicts a failure (risk {risk:.2f}): {why}",
                only_if_movable=True,
            )

    async def _poll_forever(self) -> None:
        while True:
            try:
                response = await self.stub.ListNodeRisks(
                    health.ListNodeRisksRequest(page_size=1000), timeout=CALL_TIMEOUT_S
                )
                for r in response.risks:
                    node = self.control.members.nodes.get(r.node_id)
                    if node is not None:
                        node.health_score = max(0.0, 1.0 - r.risk)
                    if r.risk >= self.drain_risk:
                        # the findings, as the alert that may race this poll words them
                        why = "; ".join(r.reasons) or ", ".join(r.top_signals)
                        await self._maybe_drain(r.node_id, r.risk, why)
            except grpc.RpcError as err:
                log.debug("health risks unavailable", error=str(err))
            await asyncio.sleep(self.poll_s)
