"""One node's recent telemetry: a bounded window of (time, metrics) samples (pure)."""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Sample:
    time: float  # seconds (wall clock of the sender)
    step: int
    metrics: Mapping[str, float]


class NodeWindow:
    def __init__(self, node_id: str, size: int = 120):
        self.node_id = node_id
        self.samples: deque[Sample] = deque(maxlen=size)

    def add(self, sample: Sample) -> None:
        self.samples.append(sample)

    @property
    def last_time(self) -> float:
        return self.samples[-1].time if self.samples else 0.0

    def series(self, name: str) -> list[tuple[float, float]]:
        return [(s.time, s.metrics[name]) for s in self.samples if name in s.metrics]

    def latest(self, name: str) -> float | None:
        for s in reversed(self.samples):
            if name in s.metrics:
                return s.metrics[name]
        return None

    def increase(self, counter: str) -> float:
        """How much a cumulative counter grew across the window (resets count from 0)."""
        values = [v for _, v in self.series(counter)]
        grew = 0.0
        for before, after in zip(values, values[1:], strict=False):
            grew += after - before if after >= before else after
        return grew

    def slope(self, name: str, last: int = 10) -> float:
        """Least-squares slope per second over the last ``last`` readings (0 if too few)."""
        points = self.series(name)[-last:]
        if len(points) < 3:
            return 0.0
        t0 = points[0][0]
        xs = [t - t0 for t, _ in points]
        ys = [v for _, v in points]
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        var = sum((x - mx) ** 2 for x in xs)
        if var <= 0:
            return 0.0
        return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var

    def by_step(self, name: str) -> dict[int, float]:
        """The latest reading of ``name`` at each step in the window."""
        return {s.step: s.metrics[name] for s in self.samples if name in s.metrics}
