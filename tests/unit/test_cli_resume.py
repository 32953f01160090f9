"""`stalwart job resume`: which checkpoint to resume from, and the clear refusals."""

from __future__ import annotations

import pytest

from stalwart.cli.resume import CannotResume, candidates


def test_newest_checkpoint_first():
    got = candidates("j", "running", 9, [("j.s2", 2), ("j.s8", 8), ("j.s4", 4)])
    assert got == [("j.s8", 8), ("j.s4", 4), ("j.s2", 2)]


def test_a_pending_job_resumes_too():
    assert candidates("j", "pending", 0, [("j.s4", 4)]) == [("j.s4", 4)]


@pytest.mark.parametrize(
    ("state", "checkpoints", "says"),
    [
        ("running", [], "has no complete checkpoint to resume from"),
        ("pending", [], "--checkpoint-interval"),
        ("succeeded", [("j.s4", 4)], "already succeeded at step 7"),
        ("failed", [("j.s4", 4)], "is failed, which is final"),
        ("cancelled", [("j.s4", 4)], "is cancelled, which is final"),
    ],
)
def test_refusals_say_why(state, checkpoints, says):
    with pytest.raises(CannotResume, match=says):
        candidates("j", state, 7, checkpoints)
