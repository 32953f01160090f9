"""The paramserver's update rule by value: scheduled rate per version (across a state
transfer), MEAN and SUM, clipping of the combined gradient."""

from __future__ import annotations

import pytest
import torch

from services.paramserver.job import JobModel
from stalwart import schedule
from stalwart.api import common

from .builders import header, sync_step, through_the_wire

SLOTS = 2


def plain_sgd(**kw) -> common.OptimizerSpec:
    return common.OptimizerSpec(kind=common.OPTIMIZER_KIND_SGD, lr=0.5, **kw)


def one_param_job(spec: common.OptimizerSpec) -> JobModel:
    init = {"w": torch.zeros(2, dtype=torch.float64)}
    return JobModel(header(spec, init, num_slots=SLOTS), init)


def slot_grads(value: float) -> list[dict[str, torch.Tensor]]:
    """Slot k pushes ``value * (k + 1)`` in both elements: mean 1.5 * value, sum 3 * value."""
    return [{"w": torch.full((2,), value * (k + 1), dtype=torch.float64)} for k in range(SLOTS)]


def test_each_version_steps_at_its_scheduled_rate_across_a_state_transfer():
    spec = plain_sgd(schedule=common.LrSchedule(
        kind=common.LR_SCHEDULE_KIND_COSINE, warmup_steps=2, decay_steps=4, final_lr_ratio=0.1
    ))  # fmt: skip
    job = one_param_job(spec)
    for version in range(8):
        if version == 3:
            job = through_the_wire(job)  # a backup promoted mid-schedule
        before = job.params["w"].clone()
        sync_step(job, version, slot_grads(1.0))
        rate = schedule.rate(spec, version)
        assert job.optimizer.param_groups[0]["lr"] == rate
        delta = (before - job.params["w"])[0].item()
        assert delta == pytest.approx(rate * 1.5, rel=1e-12), version  # mean of 1 and 2
    assert schedule.rate(spec, 0) == 0.0 and schedule.rate(spec, 2) == 0.5
    assert schedule.rate(spec, 7) == pytest.approx(0.05)


@pytest.mark.parametrize(
    "reduction, factor",
    [(common.GRAD_REDUCTION_UNSPECIFIED, 1.5), (common.GRAD_REDUCTION_MEAN, 1.5),
     (common.GRAD_REDUCTION_SUM, 3.0)],
)  # fmt: skip
def test_reduction(reduction, factor):
    job = one_param_job(plain_sgd(reduction=reduction))
    sync_step(job, 0, slot_grads(2.0))
    assert torch.equal(job.params["w"], torch.full((2,), -0.5 * 2.0 * factor, dtype=torch.float64))


def test_clip_by_norm_uses_the_combined_gradient():
    # each slot's gradient alone is under the bound; their mean is not
    job = one_param_job(plain_sgd(clip_grad_norm=1.0))
    sync_step(job, 0, slot_grads(0.5))  # mean [0.75, 0.75]: norm 1.06 -> clipped to 1
    step = -job.params["w"] / 0.5
    assert step.norm().item() == pytest.approx(1.0, rel=1e-5)
    want = torch.full((2,), 0.75, dtype=torch.float64)
    assert torch.allclose(step, want * (1.0 / (want.norm() + 1e-6)))
    unclipped = one_param_job(plain_sgd(clip_grad_norm=2.0))
    sync_step(unclipped, 0, slot_grads(0.5))
    assert torch.equal(unclipped.params["w"], torch.full((2,), -0.375, dtype=torch.float64))


def test_clip_by_value_clamps_the_combined_gradient():
    job = one_param_job(plain_sgd(clip_grad_value=1.0, reduction=common.GRAD_REDUCTION_SUM))
    sync_step(job, 0, slot_grads(0.25))  # sum 0.75: under the clamp
    sync_step(job, 1, slot_grads(1.0))  # sum 3.0: clamped to 1.0
    assert torch.equal(job.params["w"], torch.full((2,), -0.5 * (0.75 + 1.0), dtype=torch.float64))


def buffer_job() -> JobModel:
    init = {
        "w": torch.zeros(2),
        "bn.running_mean": torch.zeros(2),
        "bn.num_batches_tracked": torch.tensor(0),
    }
    head = header(plain_sgd(), init, num_slots=SLOTS)
    head.buffer_names.extend(["bn.running_mean", "bn.num_batches_tracked"])
    return JobModel(head, init)


def pushes(step: int) -> list[dict[str, torch.Tensor]]:
    return [
        {"w": torch.ones(2), "bn.running_mean": torch.tensor([1.0, 2.0]) * (k + step + 1),
         "bn.num_batches_tracked": torch.tensor(step + 1)}
        for k in range(SLOTS)
    ]  # fmt: skip


def test_buffers_take_the_slot_mean_and_are_never_stepped():
    job = buffer_job()
    assert len(job.optimizer.param_groups[0]["params"]) == 1  # only "w"
    sync_step(job, 0, pushes(0))
    assert torch.equal(job.params["w"], torch.full((2,), -0.5))  # mean gradient 1, lr 0.5
    assert torch.equal(job.params["bn.running_mean"], torch.tensor([1.5, 3.0]))  # (1+2)/2
    assert job.params["bn.num_batches_tracked"].item() == 1
    job = through_the_wire(job)  # a backup promoted: still buffers
    assert job.buffers == {"bn.running_mean", "bn.num_batches_tracked"}
    sync_step(job, 1, pushes(1))
    assert torch.equal(job.params["bn.running_mean"], torch.tensor([2.5, 5.0]))
    assert job.changed_since(1) == ["w", "bn.running_mean", "bn.num_batches_tracked"]


def test_buffers_are_checkpointed_as_buffers():
    from stalwart import checkpoint as ckpt

    job = buffer_job()
    items = ckpt.state_items(job.state_tensors(), job.params, 0, buffers=job.buffers)
    kinds = {i.name: i.kind for i in items}
    assert kinds["w"] == "param" and kinds["bn.running_mean"] == "buffer"
    assert kinds["bn.num_batches_tracked"] == "buffer"


def test_unknown_buffer_names_are_refused():
    init = {"w": torch.zeros(2)}
    head = header(plain_sgd(), init, num_slots=SLOTS)
    head.buffer_names.append("nope")
    with pytest.raises(Exception, match="buffer_names"):
        JobModel(head, init)


def test_a_restore_from_a_checkpoint_keeps_buffers_buffers():
    from services.paramserver.checkpointing import model_from_checkpoint
    from stalwart import codec

    job = buffer_job()
    sync_step(job, 0, pushes(0))
    tensors = job.state_tensors()
    kinds = {"w": "param", "bn.running_mean": "buffer", "bn.num_batches_tracked": "buffer"}
    manifest = common.CheckpointManifest(
        job_id=job.job_id, optimizer=job.header.optimizer, consistency=job.header.consistency,
        num_slots=SLOTS, shards=[common.ShardState(shard=0, version=1, slot_clocks=[1, 1])],
        tensors=[common.CheckpointTensor(spec=codec.spec_of(n, t), shard=0,
                                         kind=kinds.get(n, n.rpartition("/")[2]))
                 for n, t in tensors.items()],
    )  # fmt: skip
    restored = model_from_checkpoint(manifest, 0, tensors, epoch=3)
    assert restored.buffers == job.buffers
    assert len(restored.optimizer.param_groups[0]["params"]) == 1
    sync_step(restored, 1, pushes(1))
    assert torch.equal(restored.params["bn.running_mean"], torch.tensor([2.5, 5.0]))


def test_a_restore_expects_the_gradient_dtype_the_checkpoint_names():
    """A bfloat16 job restored from its checkpoint takes its trainers' bfloat16 pushes
    (for parameters; buffers' values in their own dtype) and refuses float32 ones."""
    from services.paramserver.checkpointing import model_from_checkpoint
    from stalwart import checkpoint as ckpt
    from stalwart import codec

    job = buffer_job()
    tensors = job.state_tensors()
    kinds = {"w": "param", "bn.running_mean": "buffer", "bn.num_batches_tracked": "buffer"}
    manifest = ckpt.build_manifest(
        job_id=job.job_id, checkpoint_id="c1", step=0, optimizer=job.header.optimizer,
        consistency=job.header.consistency, num_slots=SLOTS,
        shards=[common.ShardState(shard=0, version=0, slot_clocks=[0, 0])],
        tensors=[common.CheckpointTensor(spec=codec.spec_of(n, t), shard=0,
                                         kind=kinds.get(n, n.rpartition("/")[2]))
                 for n, t in tensors.items()],
        gradient_dtype=common.DTYPE_BFLOAT16,
    )  # fmt: skip
    restored = model_from_checkpoint(manifest, 0, tensors, epoch=3)
    assert restored.header.gradient_dtype == common.DTYPE_BFLOAT16
    bf16 = {"w": torch.zeros(2, dtype=torch.bfloat16)}
    restored.check_grad_specs([codec.spec_of(n, t) for n, t in bf16.items()])
    restored.check_grad_specs([codec.spec_of("bn.running_mean", tensors["bn.running_mean"])])
    with pytest.raises(Exception, match="expects DTYPE_BFLOAT16"):
        restored.check_grad_specs([codec.spec_of("w", torch.zeros(2))])
