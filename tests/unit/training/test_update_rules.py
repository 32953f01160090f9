"""Schedules, reduction, clipping, micro-batches and seeded model randomness, by value."""

from __future__ import annotations

import math

import pytest
import torch

from stalwart import gradients, models, schedule, training
from stalwart.api import common, coordinator
from stalwart.errors import ErrorKind, StalwartError
from stalwart.jobspec import normalized, validate_job_spec

DROPOUT_MODEL = "tests.unit.training.dropout_task:make"


@pytest.fixture(autouse=True, scope="module")
def _deterministic():
    training.make_deterministic()


def sched(**kw) -> common.OptimizerSpec:
    return common.OptimizerSpec(
        kind=common.OPTIMIZER_KIND_SGD, lr=0.4, schedule=common.LrSchedule(**kw)
    )


COS, LIN, STEP = (
    common.LR_SCHEDULE_KIND_COSINE,
    common.LR_SCHEDULE_KIND_LINEAR,
    common.LR_SCHEDULE_KIND_STEP,
)


@pytest.mark.parametrize(
    "spec, want",
    [
        (common.OptimizerSpec(lr=0.4), [0.4, 0.4, 0.4, 0.4, 0.4]),  # constant (no schedule)
        (sched(warmup_steps=4), [0.0, 0.1, 0.2, 0.3, 0.4, 0.4]),  # linear warmup
        (sched(kind=COS, decay_steps=4), [0.4, 0.4 * (1 + math.cos(math.pi / 4)) / 2, 0.2,
                                          0.4 * (1 + math.cos(3 * math.pi / 4)) / 2, 0.0, 0.0]),
        (sched(kind=STEP, step_size=2, gamma=0.5), [0.4, 0.4, 0.2, 0.2, 0.1]),
        (sched(kind=COS, warmup_steps=2, decay_steps=2), [0.0, 0.2, 0.4, 0.2, 0.0, 0.0]),
        (sched(kind=LIN, warmup_steps=2, decay_steps=4, final_lr_ratio=0.5),
         [0.0, 0.2, 0.4, 0.35, 0.3, 0.25, 0.2, 0.2]),
    ],
    ids=["constant", "warmup", "cosine", "step", "warmup-cosine", "warmup-linear"],
)  # fmt: skip
def test_rate_per_version(spec, want):
    got = [schedule.rate(spec, v) for v in range(len(want))]
    assert got == pytest.approx(want, abs=1e-12)


def test_decay_horizon_is_filled_from_the_job_steps_once():
    spec = models.default_spec("mlp", steps=50, optimizer=sched(kind=COS, warmup_steps=10))
    out = normalized(spec)
    assert out.optimizer.schedule.decay_steps == 40
    assert normalized(out).optimizer == out.optimizer  # idempotent
    assert spec.optimizer.schedule.decay_steps == 0  # the input is left alone


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(optimizer=sched(kind=COS, decay_steps=-1)), "decay_steps"),
        (dict(optimizer=sched(warmup_steps=-1)), "warmup_steps"),
        (dict(optimizer=sched(kind=STEP)), "step_size"),
        (dict(optimizer=sched(kind=LIN, final_lr_ratio=2)), "final_lr_ratio"),
        (dict(optimizer=sched(kind=9)), "kind"),
        (dict(optimizer=common.OptimizerSpec(kind=1, lr=1, clip_grad_norm=-1)), "clip_grad_norm"),
        (dict(optimizer=common.OptimizerSpec(kind=1, lr=1, clip_grad_value=math.inf)),
         "clip_grad_value"),
        (dict(optimizer=common.OptimizerSpec(kind=1, lr=1, reduction=7)), "reduction"),
        (dict(optimizer=common.OptimizerSpec(kind=1, lr=1, clip_grad_norm=1), num_shards=2),
         "num_shards 1"),
        (dict(micro_batches=65), "micro_batches"),
    ],
)  # fmt: skip
def test_bad_update_rules_are_refused(change, message):
    spec = normalized(models.default_spec("mlp", **change))
    with pytest.raises(StalwartError) as err:
        validate_job_spec(spec, 1024, 10**9)
    assert err.value.kind is ErrorKind.INVALID_ARGUMENT
    assert message in str(err.value)


def test_mean_divides_the_slot_order_sum_and_sum_leaves_it():
    grads = {"w": torch.tensor([3.0, 6.0]), "step": torch.tensor([4])}
    gradients.reduce_(grads, 3, common.OptimizerSpec())
    assert torch.equal(grads["w"], torch.tensor([1.0, 2.0]))
    assert torch.equal(grads["step"], torch.tensor([4]))  # integers are never divided
    gradients.reduce_(grads, 3, common.OptimizerSpec(reduction=common.GRAD_REDUCTION_SUM))
    assert torch.equal(grads["w"], torch.tensor([1.0, 2.0]))


def test_clip_by_global_norm_spans_every_tensor():
    a, b = torch.zeros(2, requires_grad=True), torch.zeros(1, requires_grad=True)
    a.grad, b.grad = torch.tensor([3.0, 0.0]), torch.tensor([4.0])  # global norm 5
    norm = gradients.clip_({"a": a, "b": b}, common.OptimizerSpec(clip_grad_norm=1.0))
    assert norm == 5.0
    total = torch.cat([a.grad, b.grad]).norm()
    assert total.item() == pytest.approx(1.0, rel=1e-5)
    assert a.grad[0].item() == pytest.approx(0.6, rel=1e-5)


def test_clip_by_value_then_norm():
    a = torch.zeros(3, requires_grad=True)
    a.grad = torch.tensor([-9.0, 0.5, 9.0])
    norm = gradients.clip_({"a": a}, common.OptimizerSpec(clip_grad_value=1.0))
    assert norm is None
    assert torch.equal(a.grad, torch.tensor([-1.0, 0.5, 1.0]))


def test_micro_batches_average_the_consecutive_batches_of_the_slot():
    spec = models.default_spec("mlp", model_args={"inputs": "8", "hidden": "8", "layers": "1"},
                               micro_batches=2, batch_size=4)  # fmt: skip
    task = models.resolve(spec)
    model = task.build_model(spec.seed)
    got = training.compute_step(task, model, 1, 3, spec)
    assert got.examples == 8
    model.zero_grad(set_to_none=True)
    losses = []
    for micro_step in (6, 7):  # step 3 of slot 1, micro-batches 0 and 1
        x, y = task.batch(spec.seed, 1, micro_step, 4)
        loss = task.loss(model, x, y)
        (loss / 2).backward()
        losses.append(loss.item())
    for name, p in model.named_parameters():
        assert torch.equal(got.grads[name], p.grad), name
    assert got.loss == pytest.approx(sum(losses) / 2)


def _dropout_grads(slot: int, step: int) -> dict[str, torch.Tensor]:
    spec = models.default_spec(DROPOUT_MODEL, batch_size=16)
    task = models.resolve(spec)
    return training.compute_gradients(task, task.build_model(spec.seed), slot, step, spec)


def test_dropout_masks_are_a_function_of_seed_slot_and_step():
    before = torch.random.get_rng_state()
    first, again = _dropout_grads(0, 2), _dropout_grads(0, 2)  # two "trainers", fresh models
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert torch.equal(torch.random.get_rng_state(), before)  # the caller's RNG is untouched
    other = _dropout_grads(1, 2)
    assert not torch.equal(first["0.weight"], other["0.weight"])
    # and the mask really drops: the same batch in eval mode gives another gradient
    spec = models.default_spec(DROPOUT_MODEL, batch_size=16)
    task = models.resolve(spec)
    model = task.build_model(spec.seed).eval()
    plain = training.compute_gradients(task, model, 0, 2, spec)
    assert not torch.equal(first["0.weight"], plain["0.weight"])


def hand_rolled(spec, steps, wire: torch.dtype | None = None):
    """The job as a DDP user writes it: mean of slot gradients, clip_grad_norm_, LambdaLR;
    with ``wire``, each slot's gradients rounded to that dtype and back before the sum."""
    task = models.resolve(spec)
    model = task.build_model(spec.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.optimizer.lr,
                            weight_decay=spec.optimizer.weight_decay, foreach=False)  # fmt: skip
    s = schedule.resolved(spec.optimizer, spec.steps).schedule
    lr_lambda = lambda v: schedule.factor(s, v)  # noqa: E731
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
    micro = spec.micro_batches
    bn = model[1]
    for step in range(steps):
        total, stats = None, []
        start = (bn.running_mean.clone(), bn.running_var.clone(), bn.num_batches_tracked.clone())
        for slot in range(spec.num_slots):
            bn.running_mean.copy_(start[0]), bn.running_var.copy_(start[1])
            bn.num_batches_tracked.copy_(start[2])
            model.zero_grad(set_to_none=True)
            with training.model_rng(spec.seed, slot, step, torch.device("cpu")):
                for m in range(micro):
                    x, y = task.batch(spec.seed, slot, step * micro + m, spec.batch_size)
                    (task.loss(model, x, y) / micro).backward()
            grads = [p.grad.clone() for p in model.parameters()]
            if wire is not None:
                grads = [g.to(wire).to(g.dtype) for g in grads]
            total = (
                grads if total is None else [t.add_(g) for t, g in zip(total, grads, strict=True)]
            )
            stats.append((bn.running_mean.clone(), bn.running_var.clone()))
        # running statistics: the mean over slots, summed in slot order; counters: slot 0's
        bn.running_mean.copy_(sum((m for m, _ in stats[1:]), stats[0][0].clone()) / len(stats))
        bn.running_var.copy_(sum((v for _, v in stats[1:]), stats[0][1].clone()) / len(stats))
        bn.num_batches_tracked.copy_(start[2] + micro)
        for p, g in zip(model.parameters(), total, strict=True):
            p.grad = g / spec.num_slots
        by_name = dict(model.named_parameters())  # the norm is taken in name order
        torch.nn.utils.clip_grad_norm_([by_name[n] for n in sorted(by_name)],
                                       spec.optimizer.clip_grad_norm, foreach=False)  # fmt: skip
        opt.step()
        scheduler.step()
    return {n: p.detach() for n, p in model.state_dict().items()}


def everything_spec(**kw) -> coordinator.JobSpec:
    opt = common.OptimizerSpec(
        kind=common.OPTIMIZER_KIND_ADAMW, lr=3e-2, weight_decay=0.01, clip_grad_norm=0.5,
        schedule=common.LrSchedule(kind=COS, warmup_steps=2),
    )  # fmt: skip
    fields = dict(num_slots=3, steps=8, batch_size=8, micro_batches=2, optimizer=opt, seed=3)
    fields.update(kw)
    return models.default_spec(DROPOUT_MODEL, **fields)


def test_reference_run_equals_a_ddp_style_loop_bitwise():
    spec = everything_spec()
    ours = training.reference_run(spec)
    theirs = hand_rolled(spec, spec.steps)
    assert sorted(ours) == sorted(theirs)
    assert "1.running_mean" in ours and "1.num_batches_tracked" in ours
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key
    initial = training.initial_params(models.resolve(spec), spec.seed)
    assert not any(torch.equal(ours[k], initial[k]) for k in ours)
    assert ours["1.num_batches_tracked"].item() == spec.steps * spec.micro_batches


def test_bfloat16_gradients_reference_run_equals_the_loop_that_rounds_each_slots_gradient():
    """JobSpec.gradient_dtype DTYPE_BFLOAT16: each slot's gradient rounded to bfloat16,
    widened back, then everything as before (mean, clipping, schedule, buffers)."""
    spec = everything_spec(gradient_dtype=common.DTYPE_BFLOAT16)
    ours = training.reference_run(spec)
    theirs = hand_rolled(spec, spec.steps, wire=torch.bfloat16)
    assert sorted(ours) == sorted(theirs)
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key
        assert ours[key].dtype == theirs[key].dtype, key
    plain = training.reference_run(everything_spec())
    assert not torch.equal(ours["0.weight"], plain["0.weight"])  # the rounding shows
    assert torch.allclose(ours["0.weight"], plain["0.weight"], atol=1e-2)


def test_bfloat16_gradients_are_pushed_as_bfloat16_and_buffers_as_they_are():
    spec = everything_spec(gradient_dtype=common.DTYPE_BFLOAT16)
    task = models.resolve(spec)
    wide = training.compute_step(task, task.build_model(spec.seed), 1, 2, everything_spec())
    result = training.compute_step(task, task.build_model(spec.seed), 1, 2, spec)
    for name, grad in result.grads.items():
        if name in result.buffers:
            assert torch.equal(grad, wide.grads[name]), name
        else:
            assert grad.dtype == torch.bfloat16, name
            assert torch.equal(grad, wide.grads[name].to(torch.bfloat16)), name
    assert result.loss == wide.loss


def test_buffers_are_pushed_and_the_model_keeps_its_own():
    spec = everything_spec()
    task = models.resolve(spec)
    model = task.build_model(spec.seed)
    before = model[1].running_mean.clone()
    result = training.compute_step(task, model, 0, 0, spec)
    assert result.buffers == {"1.running_mean", "1.running_var", "1.num_batches_tracked"}
    assert not torch.equal(result.grads["1.running_mean"], before)  # the stats moved
    assert torch.equal(model[1].running_mean, before)  # and the model got its own back
    assert result.grads["1.num_batches_tracked"].item() == spec.micro_batches
    again = training.compute_step(task, model, 0, 0, spec)
    assert all(torch.equal(result.grads[k], again.grads[k]) for k in result.grads)


def test_combine_buffers_means_floats_and_keeps_the_first_integer():
    got = gradients.combine_buffers([torch.tensor([1.0, 2.0]), torch.tensor([3.0, 6.0])])
    assert torch.equal(got, torch.tensor([2.0, 4.0]))
    assert gradients.combine_buffers([torch.tensor(5), torch.tensor(9)]).item() == 5


def test_global_norm_does_not_depend_on_the_order_tensors_are_held_in():
    def grads():
        g = torch.Generator().manual_seed(5)
        return {n: torch.randn(50, generator=g) * (i + 1) for i, n in enumerate("abcdefgh")}

    results = []
    for names in ("abcdefgh", "hgfedcba"):
        made = grads()
        params = {}
        for n in names:
            params[n] = torch.zeros(50, requires_grad=True)
            params[n].grad = made[n]
        results.append(gradients.clip_(params, common.OptimizerSpec(clip_grad_norm=1.0)))
    assert results[0] == results[1]
