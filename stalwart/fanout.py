"""Live items to watch streams, each through a bounded queue.

A watcher that falls a whole queue behind is dropped, and its queue ends with a None
after what it holds: its stream then ends, and the client lists or replays what it
missed and watches again. Unbounded, one stalled watcher would grow the server's
memory without end; the number of watchers is bounded too (``limits.check_open``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Generic, TypeVar

from stalwart import limits

T = TypeVar("T")


class Fanout(Generic[T]):
    def __init__(self, what: str, queue_limit: int, advice: str) -> None:
        self.what = what  # "event", "alert": named in the refusal past the limit
        self.queue_limit = queue_limit
        self.advice = advice  # what a refused client can do instead
        self._queues: set[asyncio.Queue] = set()

    def __len__(self) -> int:
        return len(self._queues)

    def subscribe(self) -> asyncio.Queue:
        limits.check_open(
            f"{self.what} watchers", len(self._queues), limits.MAX_WATCHERS, self.advice
        )
        queue: asyncio.Queue = asyncio.Queue(self.queue_limit)
        self._queues.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue) -> None:
        self._queues.discard(queue)

    def publish(self, items: Iterable[T]) -> None:
        items = list(items)
        for queue in list(self._queues):
            for item in items:
                if queue.full():
                    self.end(queue)
                    break
                queue.put_nowait(item)

    def close_all(self) -> None:
        """Wake every watcher with a None so each ends its stream."""
        for queue in list(self._queues):
            self.end(queue)

    def end(self, queue: asyncio.Queue) -> None:
        """Drop the watcher; its queue ends with a None (room made if it is full)."""
        self._queues.discard(queue)
        if queue.full():
            queue.get_nowait()
        queue.put_nowait(None)
