"""Refusals no retry mends, as errors of the job's own: a model measured on torch's meta
device before it is built, a gradient refused for NaN or Inf worded by its weights."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from services.trainer import joberrors
from stalwart import usererrors
from stalwart.api import coordinator


def _task(build):
    return SimpleNamespace(build_model=build)


def _huge(seed: int) -> torch.nn.Module:  # 64 GiB of float32 weights, if it were real
    return torch.nn.Linear(1 << 17, 1 << 17, bias=False)


def test_a_model_is_measured_without_allocating_it():
    assert joberrors.meta_bytes(_task(_huge), 0) == 4 << 34


def test_a_model_that_cannot_be_built_on_meta_is_not_measured():
    def on_real_data(seed):
        raise ValueError("reads a file of weights")

    assert joberrors.meta_bytes(_task(on_real_data), 0) is None


def test_a_model_past_the_memory_available_is_refused_before_it_is_built(monkeypatch):
    monkeypatch.setattr(joberrors.meminfo, "available_bytes", lambda: 100 << 30)
    with pytest.raises(usererrors.UserCodeError) as refused:
        joberrors.check_room(_task(_huge), coordinator.JobSpec(), (2,))
    err = refused.value
    assert (err.phase, err.error_type, err.step, err.slot) == (
        usererrors.STEP, "ModelTooLarge", 0, 2)  # fmt: skip
    assert err.message.startswith("the model holds 65,536 MiB of parameters and buffers")
    monkeypatch.setattr(joberrors.meminfo, "available_bytes", lambda: 200 << 30)
    joberrors.check_room(_task(_huge), coordinator.JobSpec(), (2,))  # 3 x 64 GiB fits in 200


def _model(*values: float) -> torch.nn.Module:
    model = torch.nn.Linear(len(values), 1, bias=False).requires_grad_(False)
    model.weight.copy_(torch.tensor([values]))
    return model


def test_finite_weights_are_named_by_their_largest_magnitude():
    error = joberrors.not_finite(_model(0.5, -3e20), step=4, slot=1)
    assert (error.phase, error.error_type, error.step, error.slot) == (
        usererrors.STEP, "NonFiniteGradient", 4, 1)  # fmt: skip
    assert error.message.endswith("finite, the largest 3e+20 in magnitude")


def test_non_finite_weights_say_training_diverged():
    for bad in (float("inf"), float("nan")):
        error = joberrors.not_finite(_model(1.0, bad), step=2, slot=0)
        assert "so do the weights it was computed from: training diverged" in error.message
