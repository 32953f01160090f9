"""Recent alerts and their watchers (asyncio queues; no gRPC)."""

from __future__ import annotations

import asyncio
import itertools
from collections import deque

from stalwart import limits
from stalwart.api import health

WATCH_QUEUE = 1000  # a watcher this far behind is cut off (it can list and re-watch)


class AlertLog:
    def __init__(self, kept: int):
        self.alerts: deque[health.Alert] = deque(maxlen=kept)
        self.watchers: set[asyncio.Queue] = set()
        self._ids = itertools.count(1)

    def next_id(self) -> str:
        return f"alert-{next(self._ids)}"

    def publish(self, alert: health.Alert) -> None:
        self.alerts.append(alert)
        for queue in list(self.watchers):
            try:
                queue.put_nowait(alert)
            except asyncio.QueueFull:
                self.watchers.discard(queue)  # its stream sees this and ends

    def cut_off(self, queue: asyncio.Queue) -> bool:
        return queue not in self.watchers

    def subscribe(self) -> asyncio.Queue:
        limits.check_watchers("alert", len(self.watchers), "close one, or list the alerts")
        queue: asyncio.Queue = asyncio.Queue(WATCH_QUEUE)
        self.watchers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue) -> None:
        self.watchers.discard(queue)

    def newest_first(self, node_id: str = "") -> list[health.Alert]:
        return [a for a in reversed(self.alerts) if not node_id or a.node_id == node_id]
