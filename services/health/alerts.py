"""Recent alerts, and their watchers (asyncio queues; no gRPC)."""

from __future__ import annotations

import itertools
from collections import deque

from stalwart.api import health
from stalwart.fanout import Fanout

WATCH_QUEUE = 1000  # a watcher this far behind is cut off (it can list and re-watch)


class AlertLog(Fanout[health.Alert]):
    def __init__(self, kept: int):
        super().__init__("alert", WATCH_QUEUE, "close one, or list the alerts")
        self.alerts: deque[health.Alert] = deque(maxlen=kept)
        self._ids = itertools.count(1)

    def next_id(self) -> str:
        return f"alert-{next(self._ids)}"

    def add(self, alert: health.Alert) -> None:
        """Keep the alert and hand it to the watchers."""
        self.alerts.append(alert)
        self.publish([alert])

    def newest_first(self, node_id: str = "") -> list[health.Alert]:
        return [a for a in reversed(self.alerts) if not node_id or a.node_id == node_id]
