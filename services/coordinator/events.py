"""The leader's event stream: numbered, persisted before anyone sees them, fanned out live.

A watcher's queue ending in None means: the stream is over, reconnect.
Sequence numbers continue across leaders: a new leader starts after the
highest sequence in the store. Watchers replay from the store, then follow the
live fan-out; a watcher too slow to keep up is cut off (its queue is bounded)
and reconnects with ``after_sequence``, replaying what it missed.
"""

from __future__ import annotations

import asyncio
import time

from services.coordinator.convert import timestamp
from stalwart import limits
from stalwart.api import common

QUEUE_LIMIT = 10_000


class EventLog:
    def __init__(self) -> None:
        self.last_sequence = 0
        self._pending: list[common.Event] = []
        self._watchers: set[asyncio.Queue] = set()

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

    def publish(self, events: list[common.Event]) -> None:
        """Hand persisted events to live watchers."""
        for queue in list(self._watchers):
            for event in events:
                if queue.full():
                    self._end(queue)  # it reconnects and replays from the store
                    break
                queue.put_nowait(event)

    def subscribe(self) -> asyncio.Queue:
        # each holds a call and up to QUEUE_LIMIT events: unbounded, they would
        # exhaust the leader's memory
        limits.check_watchers("event", len(self._watchers), "close one first")
        queue: asyncio.Queue = asyncio.Queue(QUEUE_LIMIT)
        self._watchers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue) -> None:
        self._watchers.discard(queue)

    def close_all(self) -> None:
        """Leadership ended: wake every watcher with a None so it ends its stream."""
        for queue in list(self._watchers):
            self._end(queue)

    def _end(self, queue: asyncio.Queue) -> None:
        """Make the watcher's stream end: a None after what it has (room made if full)."""
        self._watchers.discard(queue)
        if queue.full():
            queue.get_nowait()
        queue.put_nowait(None)
