"""The discrete-event core: a time-ordered queue of callbacks and a job's ledger of
productive time.

A job is, at any moment, either *blocked* (restarting, checkpointing, waiting for a
detector) or running at a *rate* in [0, 1] of its nominal throughput (less than 1 while a
replica is missing or a slow node holds every synchronous step back). Productive time
accrues at that rate while running and is *pending* until a checkpoint commits it; a
rollback throws the pending part away. ETTR = productive time / wall time.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable


class EventQueue:
    """Callbacks ordered by time; ties in the order they were scheduled (deterministic)."""

    def __init__(self) -> None:
        self._heap: list = []
        self._seq = 0
        self.now = 0.0

    def at(self, t: float, fn: Callable, *args) -> None:
        heapq.heappush(self._heap, (max(t, self.now), self._seq, fn, args))
        self._seq += 1

    def next_time(self) -> float:
        """When the next scheduled callback runs (infinity when none)."""
        return self._heap[0][0] if self._heap else float("inf")

    def run(self, until: float) -> None:
        while self._heap and self._heap[0][0] <= until:
            t, _, fn, args = heapq.heappop(self._heap)
            self.now = t
            fn(*args)
        self.now = until


class Ledger:
    """Where a job's wall time went. Call :meth:`advance` before changing any state."""

    def __init__(self) -> None:
        self.t = 0.0
        self.blocked_until = 0.0
        self.block_reason = ""
        self.rate = 1.0
        self.committed = 0.0
        self.pending = 0.0
        self.lost = 0.0  # productive time thrown away by rollbacks
        self.blocked = defaultdict(float)  # reason -> wall seconds blocked
        self.degraded = 0.0  # wall seconds x (1 - rate) while running below full rate

    @property
    def productive(self) -> float:
        return self.committed + self.pending

    def advance(self, now: float) -> None:
        if now <= self.t:
            return
        stop = min(now, self.blocked_until)
        if stop > self.t:
            self.blocked[self.block_reason] += stop - self.t
        start = max(self.t, self.blocked_until)
        if now > start:
            self.pending += self.rate * (now - start)
            self.degraded += (1.0 - self.rate) * (now - start)
        self.t = now

    def block(self, now: float, seconds: float, reason: str) -> float:
        """Blocked until ``now + seconds`` at least; returns when the job runs again."""
        self.advance(now)
        if now + seconds > self.blocked_until:
            self.blocked_until = now + seconds
            self.block_reason = reason
        return self.blocked_until

    def set_rate(self, now: float, rate: float) -> None:
        self.advance(now)
        self.rate = rate

    def checkpoint_cycles(self, now: float, cycles: int, stall_s: float, run_s: float) -> float:
        """``cycles`` rounds of (checkpoint stall, then ``run_s`` running) from ``now`` with
        nothing else happening: the same as stepping through them one event at a time.
        Each stall commits what was pending when it began. Returns the time they end."""
        self.advance(now)
        self.blocked["checkpoint"] += cycles * stall_s
        self.committed += self.pending + self.rate * (cycles - 1) * run_s
        self.pending = self.rate * run_s
        self.degraded += (1.0 - self.rate) * cycles * run_s
        end = now + cycles * (stall_s + run_s)
        self.blocked_until = end - run_s
        self.block_reason = "checkpoint"
        self.t = end
        return end

    def commit(self, amount: float | None = None) -> None:
        amount = self.pending if amount is None else min(amount, self.pending)
        self.committed += amount
        self.pending -= amount

    def rollback(self, now: float) -> None:
        self.advance(now)
        self.lost += self.pending
        self.pending = 0.0

    def rollback_to(self, now: float, committed: float) -> None:
        """Back to an older checkpoint (silent corruption found late): everything after it is lost."""
        self.rollback(now)
        if committed < self.committed:
            self.lost += self.committed - committed
            self.committed = committed

    def running(self, now: float) -> bool:
        return now >= self.blocked_until
