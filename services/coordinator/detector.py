"""Accrual failure detection over heartbeat arrival times: tells slow from dead.

A fixed lease (silent 1 s -> dead) cannot tell a node that stopped from one
whose beats arrive late because the machine is busy: under load every lease
lapses at once. An accrual detector (Hayashibara et al.; Cassandra's
variant) instead scores how unlikely the current silence is given the
intervals this node's beats actually arrived at:

    phi(t) = -log10(P(no beat for t)) = t / (mean interval * ln 10)

with inter-arrival times modelled as exponential (heavy-tailed enough for a
loaded machine, and needing only the mean). A node is declared dead when phi
reaches ``threshold``: silence >= threshold * ln 10 * mean. On a loaded
machine the beats spread out, the mean grows and so does the window. The
window is clamped between a floor (no node is declared dead sooner, whatever
its history: the shortest silence the project treats as meaningful) and a
ceiling (a node that slows down step by step cannot push its window to hours).

Plain code: arrival times are passed in, nothing here reads a clock.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

LN10 = math.log(10)


@dataclass(frozen=True)
class DetectorConfig:
    interval_s: float
    """Beat interval nodes are told to keep: the mean assumed before any is measured."""
    floor_s: float
    """Least silence after which a node may be declared dead."""
    ceiling_s: float
    """Silence after which a node is dead whatever its history."""
    threshold: float = 8.0
    """phi at which a node is declared dead (8: one chance in 10**8 of a live node)."""
    samples: int = 100
    """Inter-arrival times remembered per node."""

    @classmethod
    def fixed(cls, lease_s: float) -> DetectorConfig:
        """A plain lease: dead after exactly ``lease_s`` of silence."""
        return cls(interval_s=lease_s, floor_s=lease_s, ceiling_s=lease_s)


class ArrivalWindow:
    """One node's recent heartbeat arrivals."""

    def __init__(self, config: DetectorConfig, now: float) -> None:
        self.config = config
        self.last = now
        self._intervals: deque[float] = deque(maxlen=config.samples)
        self._sum = 0.0

    def heartbeat(self, now: float) -> None:
        interval = now - self.last
        if interval <= 0:
            return  # a retried beat, or clocks that went backwards: nothing learned
        if len(self._intervals) == self._intervals.maxlen:
            self._sum -= self._intervals[0]
        self._intervals.append(interval)
        self._sum += interval
        self.last = now

    def mean(self) -> float:
        # The expected interval counts as one sample, so that the first few fast
        # beats (or a burst of retries) do not shrink the window to nothing.
        return (self._sum + self.config.interval_s) / (len(self._intervals) + 1)

    def phi(self, now: float) -> float:
        return max(0.0, now - self.last) / (self.mean() * LN10)

    def window_s(self) -> float:
        """Silence after which this node is declared dead."""
        c = self.config
        return min(c.ceiling_s, max(c.floor_s, c.threshold * LN10 * self.mean()))

    def deadline(self) -> float:
        return self.last + self.window_s()

    def dead(self, now: float) -> bool:
        return now >= self.deadline()
