"""The per-job metric history: de-duplication, the bound, pages and the summary."""

from __future__ import annotations

import math

import pytest

from services.paramserver import history


def test_losses_are_kept_once_per_step_and_slot():
    h = history.History()
    assert h.record_loss(0, 0, 2.5)
    assert h.record_loss(0, 1, 1.5)
    assert not h.record_loss(0, 1, 9.0)  # a retried or recomputed push
    records, more = h.after(0, 10)
    assert [(r.step, r.slot, r.loss) for r in records] == [(0, 0, 2.5), (0, 1, 1.5)]
    assert [r.sequence for r in records] == [1, 2] and not more
    s = h.summary()
    assert (s.latest_step, s.latest_loss, s.loss_slots) == (0, 2.0, 2)


def test_summary_follows_the_highest_step_and_version():
    h = history.History()
    h.record_loss(3, 0, 1.0)
    h.record_loss(2, 1, 7.0)  # a late slot of an older step does not move the latest
    h.record_evaluation(10, {"accuracy": 0.5})
    h.record_evaluation(5, {"accuracy": 0.1})
    assert not h.record_evaluation(10, {"accuracy": 0.9})
    s = h.summary()
    assert (s.latest_step, s.latest_loss, s.loss_slots) == (3, 1.0, 1)
    assert s.last_evaluation.step == 10 and s.last_evaluation.metrics == (("accuracy", 0.5),)
    assert s.last_sequence == 4


def test_bound_drops_the_oldest_and_pages_stay_contiguous():
    h = history.History(max_records=5)
    for step in range(12):
        h.record_loss(step, 0, float(step))
    assert len(h) == 5 and h.summary().dropped == 7
    records, more = h.after(0, 3)
    assert [r.step for r in records] == [7, 8, 9] and more
    records, more = h.after(records[-1].sequence, 3)
    assert [r.step for r in records] == [10, 11] and not more
    assert h.after(12, 3) == ([], False)
    assert h.record_loss(0, 0, 0.0)  # its key left with the record


def test_non_finite_losses_are_not_kept():
    h = history.History()
    assert not h.record_loss(0, 0, math.nan)
    assert len(h) == 0


@pytest.mark.parametrize(
    ("version", "metrics", "problem"),
    [
        (-1, {"a": 1.0}, "version must be >= 0"),
        (1, {}, "at least one metric"),
        (1, {f"m{i}": 1.0 for i in range(17)}, "at most 16"),
        (1, {"": 1.0}, "1-64 characters"),
        (1, {"x" * 65: 1.0}, "1-64 characters"),
        (1, {"loss": math.inf}, "not finite"),
        (1, {"loss": 0.1, "accuracy": 0.9}, ""),
    ],
)
def test_check_evaluation(version, metrics, problem):
    got = history.check_evaluation(version, metrics)
    assert (problem in got) if problem else got == ""
