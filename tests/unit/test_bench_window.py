"""Steady-state rates from the leader's step events, and windows too short to time."""

from __future__ import annotations

import pytest

from stalwart.bench.window import MIN_WINDOW_S, WindowTooShort, steps_per_s
from stalwart.demo.timeline import Ev


def _committed(job: str, times: dict[int, float]) -> list[Ev]:
    return [
        Ev(i, "STEP_COMMITTED", t, job_id=job, step=s) for i, (s, t) in enumerate(times.items())
    ]


def test_the_rate_counts_the_steps_after_the_first_one_to_the_last() -> None:
    events = _committed("j", {10: 100.0, 11: 100.5, 50: 104.0})
    events += _committed("other", {10: 90.0, 50: 99.0})  # another job's events are not used
    events.append(Ev(99, "NODE_DEAD", 103.0, job_id="j", step=50))
    assert steps_per_s(events, "j", 10, 50) == pytest.approx(40 / 4.0)


def test_a_window_shorter_than_the_leaders_clock_can_time_is_refused() -> None:
    # one poll saw steps 19 and 20 move: both carry the same time
    events = _committed("j", {19: 7.25, 20: 7.25})
    with pytest.raises(WindowTooShort, match=r"steps 20-20 took 0\.00s .* give more --steps"):
        steps_per_s(events, "j", 19, 20)
    events = _committed("j", {19: 7.0, 20: 7.0 + MIN_WINDOW_S / 2})
    with pytest.raises(WindowTooShort):
        steps_per_s(events, "j", 19, 20)
