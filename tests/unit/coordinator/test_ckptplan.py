"""When the leader orders a periodic checkpoint (ckptplan.next_order): at every multiple
of the interval the job reaches, at once (the newest version the primaries can still
snapshot) when the job went past one while the last save was under way, and at the
version it stands at when it went past one and stopped moving."""

from __future__ import annotations

import pytest

from services.coordinator.ckptplan import Order, next_order

N, STEPS = 4, 20


@pytest.mark.parametrize(
    ("current", "last_saved", "last_failed", "want"),
    [
        (0, -1, -1, Order(4)),  # a new job: the first mark
        (3, -1, -1, Order(4)),
        (5, 4, -1, Order(8)),  # a slow job: the saves keep up, every mark in turn
        (8, 4, -1, Order(9, passed=1)),  # at a mark with no checkpoint: the next version
        (9, 4, -1, Order(10, passed=1)),  # the job outran the save of 4: catch up now
        (13, 4, -1, Order(14, passed=2)),  # two marks gone by: one checkpoint covers both
        (9, 8, -1, Order(12)),
        (10, 10, -1, Order(12)),  # after a catch-up, the marks go on as before
        (9, 8, 4, Order(12)),  # an old failure before the newest checkpoint: no matter
        (19, 16, -1, Order(20)),
        (20, 16, -1, Order(20, passed=1)),  # the last step: nothing moves past it
        (9, 4, 10, Order(12, passed=1)),  # the catch-up at 10 failed: the next mark, not 10
        (6, 4, 8, Order(12)),  # the order at 8 failed: a failing store waits an interval
        (50, -1, -1, None),  # past the last step (a job the leader sees finishing)
    ],
)
def test_next_order(current, last_saved, last_failed, want) -> None:
    assert next_order(current, N, STEPS, last_saved, last_failed) == want


@pytest.mark.parametrize(
    ("current", "last_saved", "last_failed", "want"),
    [
        (9, 4, -1, Order(9, passed=1)),  # past mark 8 and hung: the version it holds
        (8, 4, -1, Order(8, passed=1)),  # hung right at the mark
        (13, 4, -1, Order(13, passed=2)),
        (9, 4, 10, Order(9, passed=1)),  # the order at 10 timed out: 10 never comes
        (9, 4, 9, Order(12, passed=1)),  # the order at 9 itself failed: back off
        (6, 4, -1, Order(8)),  # no mark passed: the next one, as when moving
        (5, -1, -1, Order(5, passed=1)),  # no checkpoint yet
        (20, 16, -1, Order(20, passed=1)),
    ],
)
def test_a_stalled_job_is_checkpointed_where_it_stands(current, last_saved, last_failed, want):
    assert next_order(current, N, STEPS, last_saved, last_failed, stalled=True) == want


def test_no_interval_no_checkpoints() -> None:
    assert next_order(7, 0, STEPS, -1) is None


def test_a_last_step_that_is_no_mark_is_still_reached() -> None:
    assert next_order(18, N, 18, 12) == Order(18, passed=1)  # mark 16 passed, 18 is the end
    assert next_order(17, N, 18, 16) is None


def _run(interval: int, steps: int, moved: int) -> list[int]:
    """The versions a job that moves ``moved`` steps during each save is checkpointed
    at: each order is waited for (the primaries snapshot at it), then the upload lets
    the job go on."""
    current, saved = 0, [0]
    while (order := next_order(current, interval, steps, saved[-1])) is not None:
        assert order.at > saved[-1] and order.at >= current
        current = order.at + moved
        saved.append(order.at)
    return saved[1:]


def test_a_fast_job_is_checkpointed_as_often_as_the_saves_allow() -> None:
    # every save lets the job go 5 steps further, more than the interval of 4: ordering
    # only at the next multiple would give 4, 12, 20, 28, 36 (half the marks untouched)
    saved = _run(4, 40, moved=5)
    assert saved == [4, 10, 16, 22, 28, 34, 40]
    gaps = [b - a for a, b in zip(saved, saved[1:], strict=False)]
    assert max(gaps) == 6  # one save's worth of steps plus the one it waits for


@pytest.mark.parametrize("moved", [0, 1, 2, 3])
def test_a_job_the_saves_keep_up_with_gets_every_multiple(moved) -> None:
    assert _run(4, 40, moved) == list(range(4, 41, 4))
