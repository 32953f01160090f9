"""Local SGD / DiLoCo (JobSpec.local_steps): the pseudo-gradient compute_step pushes, by value.

Inner steps are checked against a loop written the way a user would (torch.optim.SGD
over the same batches and the same seeded RNG), bit for bit; the model must come out
of compute_step with the weights it went in with; bad settings are refused.
"""

from __future__ import annotations

import math

import pytest
import torch

from stalwart import models, training
from stalwart.api import common, coordinator
from stalwart.errors import ErrorKind, StalwartError
from stalwart.jobspec import MAX_LOCAL_STEPS, normalized, validate_job_spec

DROPOUT_MODEL = "tests.unit.training.dropout_task:make"
CPU = torch.device("cpu")


@pytest.fixture(autouse=True, scope="module")
def _deterministic():
    training.make_deterministic()


def local_spec(**kw) -> coordinator.JobSpec:
    """Dropout, batch norm and LayerNorm, two micro-batches: every path an inner step takes."""
    fields = dict(num_slots=2, steps=3, batch_size=8, micro_batches=2, seed=5,
                  local_steps=4, local_lr=0.05)  # fmt: skip
    fields.update(kw)
    return models.default_spec(DROPOUT_MODEL, **fields)


def state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: t.detach().clone() for n, t in model.state_dict().items()}


def hand_written(spec, slot: int, step: int):
    """H steps of torch.optim.SGD(local_lr) from the seeded weights; (theta_0, theta_H, losses)."""
    task = models.resolve(spec)
    model = task.build_model(spec.seed)
    start = state(model)
    opt = torch.optim.SGD(model.parameters(), lr=spec.local_lr, foreach=False)
    h, micro = spec.local_steps, spec.micro_batches
    losses = []
    for k in range(h):
        opt.zero_grad(set_to_none=True)
        inner = []
        with training.model_rng(spec.seed, slot, step * h + k, CPU):
            for m in range(micro):
                x, y = task.batch(spec.seed, slot, (step * h + k) * micro + m, spec.batch_size)
                loss = task.loss(model, x, y)
                (loss / micro).backward()
                inner.append(loss.item())
        opt.step()
        losses.append(sum(inner) / micro)
    return start, state(model), losses


def test_one_local_step_is_the_plain_sync_gradient_bitwise():
    plain = local_spec(local_steps=0, local_lr=0.0)
    one = local_spec(local_steps=1, local_lr=0.0)
    task = models.resolve(plain)
    got = [training.compute_step(task, task.build_model(s.seed), 1, 2, s) for s in (plain, one)]
    assert sorted(got[0].grads) == sorted(got[1].grads)
    for name in got[0].grads:
        assert torch.equal(got[0].grads[name], got[1].grads[name]), name
    assert (got[0].loss, got[0].examples) == (got[1].loss, got[1].examples)
    # and it is a gradient, not a difference of weights: the hand-written backward's
    model = task.build_model(plain.seed)
    with training.model_rng(plain.seed, 1, 2, CPU):
        for m in range(2):
            x, y = task.batch(plain.seed, 1, 2 * 2 + m, plain.batch_size)
            (task.loss(model, x, y) / 2).backward()
    for name, p in model.named_parameters():
        assert torch.equal(got[0].grads[name], p.grad), name


def test_pseudo_gradient_equals_a_hand_written_inner_loop_bitwise():
    spec = local_spec()
    task = models.resolve(spec)
    model = task.build_model(spec.seed)
    result = training.compute_step(task, model, 1, 2, spec)
    start, end, losses = hand_written(spec, 1, 2)
    for name, _ in model.named_parameters():
        assert torch.equal(result.grads[name], start[name] - end[name]), name
        assert result.grads[name].abs().sum() > 0, f"{name} never moved"
    for name in result.buffers:  # the buffers the H inner steps reached
        assert torch.equal(result.grads[name], end[name]), name
    assert result.grads["1.num_batches_tracked"].item() == 4 * 2  # H steps x 2 micro-batches
    assert result.loss == pytest.approx(sum(losses) / len(losses))
    assert result.examples == 4 * 2 * spec.batch_size


def test_the_model_gets_its_weights_and_buffers_back():
    spec = local_spec()
    task = models.resolve(spec)
    model = task.build_model(spec.seed)
    before = state(model)
    first = training.compute_step(task, model, 0, 1, spec)
    after = state(model)
    assert all(torch.equal(before[n], after[n]) for n in before)
    again = training.compute_step(
        task, model, 0, 1, spec
    )  # a recomputation, e.g. duplicate compute
    assert all(torch.equal(first.grads[n], again.grads[n]) for n in first.grads)


def test_an_inner_step_that_raises_leaves_the_weights_as_they_were():
    spec = local_spec()
    task = models.resolve(spec)
    model = task.build_model(spec.seed)
    before = state(model)
    calls = 0
    loss = task.loss

    def failing_loss(m, x, y):
        nonlocal calls
        calls += 1
        if calls == 5:  # inner step 2, after two updates
            raise RuntimeError("boom")
        return loss(m, x, y)

    task.loss = failing_loss
    with pytest.raises(RuntimeError, match="boom"):
        training.compute_step(task, model, 0, 0, spec)
    assert calls == 5
    after = state(model)
    assert all(torch.equal(before[n], after[n]) for n in before)
    assert all(p.grad is None for p in model.parameters())


def test_steps_count_outer_steps_in_the_reference_run():
    """Model averaging (outer SGD lr 1, MEAN): one outer step lands on the slots' mean weights."""
    outer = common.OptimizerSpec(kind=common.OPTIMIZER_KIND_SGD, lr=1.0)
    spec = local_spec(steps=1, optimizer=outer)
    got = training.reference_run(spec)
    ends = [hand_written(spec, slot, 0)[1] for slot in range(spec.num_slots)]
    task = models.resolve(spec)
    for name, _ in task.build_model(spec.seed).named_parameters():
        want = sum(e[name] for e in ends) / len(ends)
        torch.testing.assert_close(got[name], want, rtol=1e-5, atol=1e-6)
    assert got["1.num_batches_tracked"].item() == 4 * 2


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(local_steps=MAX_LOCAL_STEPS + 1), "local_steps must be in [0, 1024]"),
        (dict(local_steps=-1), "local_steps must be in"),
        (dict(local_lr=0.0), "local_lr must be > 0"),
        (dict(local_lr=-0.1), "local_lr must be > 0"),
        (dict(local_lr=math.nan), "local_lr must be > 0"),
        (dict(local_lr=math.inf), "local_lr must be > 0"),
        (dict(local_steps=1, local_lr=0.1), "local_lr 0.1 needs local_steps > 1"),
        (dict(local_steps=0, local_lr=0.1), "needs local_steps > 1"),
        (dict(consistency=common.ConsistencySpec(mode=common.CONSISTENCY_MODE_ASYNC)),
         "local_steps > 1 needs consistency mode SYNC"),
    ],
)  # fmt: skip
def test_bad_local_sgd_settings_are_refused(change, message):
    spec = normalized(local_spec(**change))
    with pytest.raises(StalwartError) as err:
        validate_job_spec(spec, 1024, 10**9)
    assert err.value.kind is ErrorKind.INVALID_ARGUMENT
    assert message in str(err.value)


@pytest.mark.parametrize("h", [0, 1, 2, MAX_LOCAL_STEPS])
def test_good_local_sgd_settings_pass(h):
    spec = local_spec(local_steps=h, local_lr=0.05 if h > 1 else 0.0)
    validate_job_spec(normalized(spec), 1024, 10**9)


def test_the_warm_up_copy_is_a_plain_sync_spec():
    spec = local_spec()
    warm = training.one_inner_step(spec)
    assert (warm.local_steps, warm.local_lr) == (0, 0.0)
    assert (spec.local_steps, spec.local_lr) == (4, 0.05)  # the job's own spec is untouched
