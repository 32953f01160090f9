"""A gradient refused for NaN or Inf becomes an error of the job's own, worded by its weights."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from services.trainer.worker import _not_finite
from stalwart import usererrors


def _job(*values: float):
    return SimpleNamespace(model=torch.nn.Linear(len(values), 1, bias=False).requires_grad_(False)
                           .apply(lambda m: m.weight.copy_(torch.tensor([values]))))  # fmt: skip


def test_finite_weights_are_named_by_their_largest_magnitude():
    error = _not_finite(_job(0.5, -3e20), step=4, slot=1)
    assert (error.phase, error.error_type, error.step, error.slot) == (
        usererrors.STEP, "NonFiniteGradient", 4, 1)  # fmt: skip
    assert error.message.endswith("finite, the largest 3e+20 in magnitude")


def test_non_finite_weights_say_training_diverged():
    for bad in (float("inf"), float("nan")):
        error = _not_finite(_job(1.0, bad), step=2, slot=0)
        assert "so do the weights it was computed from: training diverged" in error.message
