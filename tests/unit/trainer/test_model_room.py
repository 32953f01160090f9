"""A trainer measures a model on torch's meta device before building it for real."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from services.trainer import worker
from stalwart import usererrors
from stalwart.api import coordinator


def _task(build):
    return SimpleNamespace(build_model=build)


def _huge(seed: int) -> torch.nn.Module:  # 64 GiB of float32 weights, if it were real
    return torch.nn.Linear(1 << 17, 1 << 17, bias=False)


def test_a_model_is_measured_without_allocating_it():
    assert worker._meta_bytes(_task(_huge), 0) == 4 << 34


def test_a_model_that_cannot_be_built_on_meta_is_not_measured():
    def on_real_data(seed):
        raise ValueError("reads a file of weights")

    assert worker._meta_bytes(_task(on_real_data), 0) is None


def test_a_model_past_the_memory_available_is_refused_before_it_is_built(monkeypatch):
    monkeypatch.setattr(worker.meminfo, "available_bytes", lambda: 100 << 30)
    with pytest.raises(usererrors.UserCodeError) as refused:
        worker._check_room(_task(_huge), coordinator.JobSpec(), (2,))
    err = refused.value
    assert (err.phase, err.error_type, err.step, err.slot) == (
        usererrors.STEP, "ModelTooLarge", 0, 2)  # fmt: skip
    assert err.message.startswith("the model holds 65,536 MiB of parameters and buffers")
    monkeypatch.setattr(worker.meminfo, "available_bytes", lambda: 200 << 30)
    worker._check_room(_task(_huge), coordinator.JobSpec(), (2,))  # 3 x 64 GiB fits in 200
