"""char-lm: a pure batch function over the standard library's bytes, and a short run that
learns more than byte frequencies (held-out loss under the unigram loss)."""

from __future__ import annotations

import pytest
import torch

from stalwart import models, training
from stalwart.models import charlm


def test_batches_are_pure_and_shifted_by_one():
    spec = models.default_spec("char-lm")
    task = models.resolve(spec)
    x, y = task.batch(0, 1, 5, 4)
    x2, y2 = task.batch(0, 1, 5, 4)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert x.shape == (4, 64) and torch.equal(x[:, 1:], y[:, :-1])
    assert not torch.equal(x, task.batch(0, 1, 6, 4)[0])
    assert len(charlm.corpus()) > 100_000


def test_default_spec_is_what_small_transformers_use():
    spec = models.default_spec("char-lm")
    opt = spec.optimizer
    assert opt.kind == models.registry.common.OPTIMIZER_KIND_ADAMW
    assert opt.clip_grad_norm == 1.0 and opt.schedule.warmup_steps == 30
    assert spec.micro_batches == 2


@pytest.mark.timeout(240)
def test_a_short_run_beats_the_unigram_loss():
    training.make_deterministic()
    spec = models.default_spec(
        "char-lm", steps=80, num_slots=1, model_args={"context": "32", "dim": "32", "layers": "1"}
    )
    spec.optimizer.schedule.warmup_steps = 5  # a short run: a short warmup, a higher rate
    spec.optimizer.lr = 1e-2
    metrics = training.evaluate(spec, training.reference_run(spec))
    assert metrics["loss"] < metrics["unigram_loss"], metrics
