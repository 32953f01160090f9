"""reference_run against a hand-rolled torch loop, bitwise; digits-cnn accuracy."""

from __future__ import annotations

import pytest
import torch

from stalwart import models, training
from stalwart.api import common


@pytest.fixture(autouse=True, scope="module")
def _deterministic():
    training.make_deterministic()


def hand_rolled(spec, steps, make_optimizer):
    """The same job written directly against torch: one model, slot gradients summed in
    slot order and divided by the slot count (the default MEAN reduction)."""
    task = models.resolve(spec)
    model = task.build_model(spec.seed)
    optimizer = make_optimizer(list(model.parameters()))
    for step in range(steps):
        total = None
        for slot in range(spec.num_slots):
            model.zero_grad(set_to_none=True)
            x, y = task.batch(spec.seed, slot, step, spec.batch_size)
            task.loss(model, x, y).backward()
            grads = [p.grad.clone() for p in model.parameters()]
            if total is None:
                total = grads
            else:
                for t, g in zip(total, grads, strict=True):
                    t += g
        for p, g in zip(model.parameters(), total, strict=True):
            p.grad = g / spec.num_slots if spec.num_slots > 1 else g
        optimizer.step()
    return {n: p.detach() for n, p in model.named_parameters()}


CASES = [
    (
        "digits-adam",
        models.default_spec("digits-cnn", model_args={"width": "8"}, num_slots=3, batch_size=16),
        lambda ps: torch.optim.Adam(ps, lr=2e-3, foreach=False),
    ),
    (
        "mlp-sgd-momentum",
        models.default_spec(
            "mlp",
            model_args={"inputs": "16", "hidden": "32", "layers": "2"},
            num_slots=2,
            optimizer=common.OptimizerSpec(kind=common.OPTIMIZER_KIND_SGD, lr=0.1, momentum=0.9),
        ),
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, foreach=False),
    ),
    (
        "embedding-adamw",
        models.default_spec(
            "embedding",
            model_args={"rows": "500", "touched": "8"},
            optimizer=common.OptimizerSpec(
                kind=common.OPTIMIZER_KIND_ADAMW, lr=1e-2, weight_decay=0.01
            ),
        ),
        lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.01, foreach=False),
    ),
]


@pytest.mark.parametrize("name, spec, make_optimizer", CASES, ids=[c[0] for c in CASES])
def test_reference_run_equals_hand_rolled_loop_bitwise(name, spec, make_optimizer):
    steps = 6
    ours = training.reference_run(spec, steps)
    theirs = hand_rolled(spec, steps, make_optimizer)
    assert list(ours) == list(theirs)
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key
    initial = training.initial_params(models.resolve(spec), spec.seed)
    assert not all(torch.equal(ours[k], initial[k]) for k in ours)  # it did train


def test_reference_run_is_repeatable():
    spec = CASES[1][1]
    a, b = training.reference_run(spec, 4), training.reference_run(spec, 4)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_compute_gradients_covers_every_parameter():
    spec = models.default_spec("digits-cnn", model_args={"width": "4"})
    task = models.resolve(spec)
    model = task.build_model(spec.seed)
    grads = training.compute_gradients(task, model, 0, 0, spec)
    assert list(grads) == [n for n, _ in model.named_parameters()]
    again = training.compute_gradients(task, model, 0, 0, spec)
    assert all(torch.equal(grads[k], again[k]) for k in grads)
    assert all(p.grad is None for p in model.parameters())


def test_sum_in_slot_order_does_not_touch_inputs():
    a, b = {"w": torch.ones(3)}, {"w": torch.full((3,), 2.0)}
    total = training.sum_in_slot_order([a, b])
    assert torch.equal(total["w"], torch.full((3,), 3.0))
    assert torch.equal(a["w"], torch.ones(3))


@pytest.mark.timeout(120)
def test_digits_cnn_defaults_reach_97_percent():
    spec = models.default_spec("digits-cnn")
    params = training.reference_run(spec)
    metrics = training.evaluate(spec, params)
    assert metrics["accuracy"] >= 0.97, metrics
