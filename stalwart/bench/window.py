"""Steady-state rates from the leader's STEP_COMMITTED events.

The leader stamps a step when its poll of the primaries (ten a second) sees the
version move, not when the step committed: each end of a window may be late by up
to a poll, and the steps one poll sees share one time. A window of a few fast steps
is then mostly that error (a 1-step window of a tiny model once printed 107,546
samples/s, 251 times the plain loop), so one shorter than MIN_WINDOW_S is refused
with what to change instead of printed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stalwart.demo.timeline import Ev

POLL_S = 0.1  # the leader's poll of the paramservers (services/coordinator/paramwatch.py)
MIN_WINDOW_S = 2.0  # a poll late at each end is then at most 10 % of the window


class WindowTooShort(ValueError):
    """The timed steps took too little time to measure from the leader's events."""


def steps_per_s(events: Iterable[Ev], job_id: str, first: int, last: int) -> float:
    """Steps per second from the end of step ``first`` to the end of step ``last``."""
    times = {e.step: e.time for e in events if e.kind == "STEP_COMMITTED" and e.job_id == job_id}
    window = times[last] - times[first]
    if window < MIN_WINDOW_S:
        raise WindowTooShort(
            f"steps {first + 1}-{last} took {window:.2f}s by the leader's events, which "
            f"are stamped every {POLL_S:g}s: too short to time (at least {MIN_WINDOW_S:g}s); "
            "give more --steps or fewer --warmup"
        )
    return (last - first) / window
