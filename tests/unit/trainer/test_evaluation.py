"""When slot 0 evaluates (JobSpec.eval_every), and which metrics it reports."""

from __future__ import annotations

import math

import pytest

from services.trainer.evaluation import MAX_METRICS, clean, due


@pytest.mark.parametrize(
    ("version", "every", "steps", "previous", "want"),
    [
        (10, 10, 100, 9, True),  # sync: every multiple
        (11, 10, 100, 10, False),
        (0, 10, 100, -1, False),  # the initial weights are not evaluated
        (10, 0, 100, 9, False),  # off
        (100, 10, 100, 99, True),  # the final version
        (95, 10, 95, 94, True),  # final even when not a multiple
        (95, 10, 95, 95, False),  # already held (and evaluated) before
        (63, 10, 100, 57, True),  # versions jumped past a multiple (async)
        (57, 10, 100, -1, False),  # a takeover's first version, not a multiple
        (60, 10, 100, -1, True),  # ... a multiple
    ],
)
def test_due(version, every, steps, previous, want):
    assert due(version, every, steps, previous) is want


def test_clean_keeps_finite_floats_by_name_and_bounds_them():
    assert clean({"loss": 1, "accuracy": 0.5, "bad": math.nan, "text": "x"}) == {
        "accuracy": 0.5,
        "loss": 1.0,
    }
    many = clean({f"m{i:02d}": float(i) for i in range(30)})
    assert len(many) == MAX_METRICS and min(many) == "m00"


def test_eval_every_is_kept_and_a_negative_one_refused():
    from stalwart import jobspec
    from stalwart.api import coordinator

    kept = jobspec.normalized(coordinator.JobSpec(model="mlp", eval_every=25))
    assert kept.eval_every == 25
    jobspec.validate_job_spec(kept, max_slots=64, max_steps=10_000)
    bad = jobspec.normalized(coordinator.JobSpec(model="mlp", eval_every=-5))
    with pytest.raises(Exception, match="eval_every must be >= 0"):
        jobspec.validate_job_spec(bad, max_slots=64, max_steps=10_000)
