"""``stalwart job submit`` flags for how gradients become updates, as one option group.

Adam's betas and eps, the reduction, clipping, the learning-rate schedule,
gradient accumulation, local SGD, the gradients' dtype on the wire, the checkpoint and evaluation intervals and the weights to start from. Only the shape of the input
is checked here; the coordinator validates the spec and answers
INVALID_ARGUMENT with the field's name.
"""

from __future__ import annotations

import dataclasses
import enum
from pathlib import Path

import typer

from stalwart.api import common, coordinator
from stalwart.cli.output import ExitCode, fail


class Schedule(enum.StrEnum):
    constant = "constant"
    cosine = "cosine"
    linear = "linear"
    step = "step"


class Reduction(enum.StrEnum):
    mean = "mean"
    sum = "sum"


class GradientDtype(enum.StrEnum):
    float32 = "float32"
    bfloat16 = "bfloat16"


_SCHEDULES = {
    "constant": common.LR_SCHEDULE_KIND_CONSTANT,
    "cosine": common.LR_SCHEDULE_KIND_COSINE,
    "linear": common.LR_SCHEDULE_KIND_LINEAR,
    "step": common.LR_SCHEDULE_KIND_STEP,
}
_REDUCTIONS = {"mean": common.GRAD_REDUCTION_MEAN, "sum": common.GRAD_REDUCTION_SUM}
_GRADIENT_DTYPES = {"float32": common.DTYPE_UNSPECIFIED, "bfloat16": common.DTYPE_BFLOAT16}


@dataclasses.dataclass(frozen=True)
class TrainingFlags:
    """The update rule and accumulation flags of a job; None: the model's default."""

    beta1: float | None = typer.Option(None, help="Adam/AdamW beta1 (default 0.9)")
    beta2: float | None = typer.Option(None, help="Adam/AdamW beta2 (default 0.999)")
    eps: float | None = typer.Option(None, help="Adam/AdamW eps (default 1e-8)")
    nesterov: bool = typer.Option(
        False,
        "--nesterov",
        help="SGD: Nesterov momentum (needs --momentum > 0; DiLoCo's outer rule)",
    )
    reduction: Reduction | None = typer.Option(
        None, help="combine slot gradients by mean (DDP's, the default) or sum"
    )
    clip_grad_norm: float | None = typer.Option(
        None,
        help="clip the combined gradient to this global L2 norm; 0 or unset: the model's default (char-lm 1.0 on one shard group, else off)",
    )
    clip_grad_value: float | None = typer.Option(
        None, help="clamp gradient elements to +-v; 0: off"
    )
    schedule: Schedule | None = typer.Option(
        None, help="learning-rate shape after warmup (default constant)"
    )
    warmup_steps: int | None = typer.Option(None, help="steps of linear warmup from 0 to --lr")
    decay_steps: int | None = typer.Option(
        None, help="cosine/linear: steps of decay; 0: steps - warmup"
    )
    final_lr_ratio: float | None = typer.Option(
        None, help="cosine/linear: final rate as a fraction of --lr"
    )
    step_size: int | None = typer.Option(None, help="step schedule: steps between decays")
    gamma: float | None = typer.Option(None, help="step schedule: factor per decay; 0: 0.1")
    micro_batches: int | None = typer.Option(
        None, help="gradient accumulation: micro-batches of --batch-size per slot and step"
    )
    local_steps: int | None = typer.Option(
        None, help="local SGD / DiLoCo: inner SGD steps per slot between pushes; 0 or 1: off"
    )
    local_lr: float | None = typer.Option(
        None, help="local SGD: the inner steps' learning rate (--lr is the outer optimizer's)"
    )
    gradient_dtype: GradientDtype | None = typer.Option(
        None, help="float32 gradients travel as bfloat16 (half the bytes) or as they are (default)"
    )
    checkpoint_interval: int | None = typer.Option(None, help="checkpoint every N steps; 0: off")
    eval_every: int | None = typer.Option(
        None, help="evaluate the weights every N versions and at the end; 0: off"
    )
    init_from: Path | None = typer.Option(
        None, help="start from these weights (.safetensors, e.g. from `job export`)"
    )

    def apply(self, spec: coordinator.JobSpec) -> coordinator.JobSpec:
        """``spec`` with the flags that were given written into it (in place; returned)."""
        opt = spec.optimizer
        _set(opt, beta1=self.beta1, beta2=self.beta2, eps=self.eps,
             clip_grad_norm=self.clip_grad_norm, clip_grad_value=self.clip_grad_value)  # fmt: skip
        if self.nesterov:
            opt.nesterov = True
        if self.reduction is not None:
            opt.reduction = _REDUCTIONS[self.reduction.value]
        shape = {
            "kind": None if self.schedule is None else _SCHEDULES[self.schedule.value],
            "warmup_steps": self.warmup_steps, "decay_steps": self.decay_steps,
            "final_lr_ratio": self.final_lr_ratio, "step_size": self.step_size,
            "gamma": self.gamma,
        }  # fmt: skip
        if any(v is not None for v in shape.values()):
            _set(opt.schedule, **shape)  # on top of the model's default schedule, if any
        _set(spec, micro_batches=self.micro_batches, checkpoint_interval=self.checkpoint_interval,
             eval_every=self.eval_every, local_steps=self.local_steps,
             local_lr=self.local_lr)  # fmt: skip
        if self.gradient_dtype is not None:
            spec.gradient_dtype = _GRADIENT_DTYPES[self.gradient_dtype.value]
        if self.init_from is not None:
            # the trainers read the path themselves: make it absolute, and catch a
            # typo here rather than as a job whose trainers cannot start it
            path = self.init_from.expanduser().resolve()
            if not path.is_file():
                what = "a folder, not a file" if path.is_dir() else "no such file"
                fail(f"--init-from {self.init_from}: {what}", ExitCode.INVALID_INPUT)
            spec.init_from = str(path)
        return spec


def _set(message, **values) -> None:
    for name, value in values.items():
        if value is not None:
            setattr(message, name, value)


def describe_rule(spec: coordinator.JobSpec) -> str:
    """What is not default in the update rule, e.g. `` cosine warmup=100 clip=1 micro=2``."""
    opt, parts = spec.optimizer, []
    if opt.reduction == common.GRAD_REDUCTION_SUM:
        parts.append("sum")
    if opt.HasField("schedule"):
        kind = {v: k for k, v in _SCHEDULES.items()}.get(opt.schedule.kind, "constant")
        parts.append(
            kind + (f" warmup={opt.schedule.warmup_steps}" * bool(opt.schedule.warmup_steps))
        )
    if opt.nesterov:
        parts.append("nesterov")
    if opt.clip_grad_norm:
        parts.append(f"clip-norm={opt.clip_grad_norm:g}")
    if opt.clip_grad_value:
        parts.append(f"clip-value={opt.clip_grad_value:g}")
    if spec.micro_batches > 1:
        parts.append(f"micro-batches={spec.micro_batches}")
    if spec.local_steps > 1:
        parts.append(f"local-steps={spec.local_steps} local-lr={spec.local_lr:g}")
    if spec.gradient_dtype == common.DTYPE_BFLOAT16:
        parts.append("gradients=bfloat16")
    if spec.eval_every:
        parts.append(f"eval-every={spec.eval_every}")
    return "".join(" " + p for p in parts)
