"""The leader's event stream: numbered, persisted before anyone sees them, fanned out live.

A watcher's queue ending in None means: the stream is over, reconnect.
Sequence numbers continue across leaders: a new leader starts after the
highest sequence in the store. Watchers replay from the store, then follow the
live fan-out; a watcher too slow to keep up is cut off (its queue is bounded)
and reconnects with ``after_sequence``, replaying what it missed.
"""

from __future__ import annotations

import time

from services.coordinator.convert import timestamp
from stalwart.api import common
from stalwart.fanout import Fanout

QUEUE_LIMIT = 10_000


class EventLog(Fanout[common.Event]):
    def __init__(self) -> None:
        # each watcher holds a call and up to QUEUE_LIMIT events
        super().__init__("event", QUEUE_LIMIT, "close one first")
        self.last_sequence = 0
        self._pending: list[common.Event] = []

    def reset(self, last_sequence: int) -> None:
        self.last_sequence = last_sequence
        self._pending.clear()

    def add(
        self,
        kind: int,
        message: str,
        *,
        job_id: str = "",
        node_id: str = "",
        step: int = 0,
        **attributes: object,
    ) -> common.Event:
        """Number an event and queue it for the next flush (persist, then publish)."""
        self.last_sequence += 1
        event = common.Event(
            sequence=self.last_sequence, kind=kind, time=timestamp(time.time()),
            job_id=job_id, node_id=node_id, step=step, message=message,
            attributes={k: str(v) for k, v in attributes.items()},
        )  # fmt: skip
        self._pending.append(event)
        return event

    @property
    def has_pending(self) -> bool:
        return bool(self._pending)

    def take_pending(self) -> list[common.Event]:
        pending, self._pending = self._pending, []
        return pending

    def put_back(self, events: list[common.Event]) -> None:
        """Events taken by a flush that did not store them: first in line again."""
        self._pending[:0] = events
