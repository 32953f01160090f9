"""``stalwart job submit`` flags for how gradients become updates, as one option group.

Adam's betas and eps, the reduction, clipping, the learning-rate schedule,
gradient accumulation, the checkpoint interval and the weights to start from. Only the shape of the input
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


_SCHEDULES = {
    "constant": common.LR_SCHEDULE_KIND_CONSTANT,
    "cosine": common.LR_SCHEDULE_KIND_COSINE,
    "linear": common.LR_SCHEDULE_KIND_LINEAR,
    "step": common.LR_SCHEDULE_KIND_STEP,
}
_REDUCTIONS = {"mean": common.GRAD_REDUCTION_MEAN, "sum": common.GRAD_REDUCTION_SUM}


@dataclasses.dataclass(frozen=True)
class TrainingFlags:
    """The update rule and accumulation flags of a job."""

    beta1: float = typer.Option(0.0, help="Adam/AdamW beta1; 0: 0.9")
    beta2: float = typer.Option(0.0, help="Adam/AdamW beta2; 0: 0.999")
    eps: float = typer.Option(0.0, help="Adam/AdamW eps; 0: 1e-8")
    reduction: Reduction = typer.Option(
        Reduction.mean, help="combine slot gradients by mean (DDP's) or sum"
    )
    clip_grad_norm: float = typer.Option(
        0.0, help="clip the combined gradient to this global L2 norm; 0: off"
    )
    clip_grad_value: float = typer.Option(0.0, help="clamp gradient elements to +-v; 0: off")
    schedule: Schedule = typer.Option(Schedule.constant, help="learning-rate shape after warmup")
    warmup_steps: int = typer.Option(0, help="steps of linear warmup from 0 to --lr")
    decay_steps: int = typer.Option(0, help="cosine/linear: steps of decay; 0: steps - warmup")
    final_lr_ratio: float = typer.Option(
        0.0, help="cosine/linear: final rate as a fraction of --lr"
    )
    step_size: int = typer.Option(0, help="step schedule: steps between decays")
    gamma: float = typer.Option(0.0, help="step schedule: factor per decay; 0: 0.1")
    micro_batches: int = typer.Option(
        1, help="gradient accumulation: micro-batches of --batch-size per slot and step"
    )
    checkpoint_interval: int = typer.Option(0, help="checkpoint every N steps; 0: off")
    init_from: Path | None = typer.Option(
        None, help="start from these weights (.safetensors, e.g. from `job export`)"
    )

    def apply(self, spec: coordinator.JobSpec) -> coordinator.JobSpec:
        """``spec`` with these flags written into it (in place; returned for chaining)."""
        opt = spec.optimizer
        opt.beta1, opt.beta2, opt.eps = self.beta1, self.beta2, self.eps
        opt.reduction = _REDUCTIONS[self.reduction.value]
        opt.clip_grad_norm, opt.clip_grad_value = self.clip_grad_norm, self.clip_grad_value
        if self.schedule is not Schedule.constant or self.warmup_steps:
            opt.schedule.CopyFrom(
                common.LrSchedule(
                    kind=_SCHEDULES[self.schedule.value],
                    warmup_steps=self.warmup_steps,
                    decay_steps=self.decay_steps,
                    final_lr_ratio=self.final_lr_ratio,
                    step_size=self.step_size,
                    gamma=self.gamma,
                )
            )
        spec.micro_batches = self.micro_batches
        spec.checkpoint_interval = self.checkpoint_interval
        if self.init_from is not None:
            # the trainers read the path themselves: make it absolute, and catch a
            # typo here rather than as a job whose trainers cannot start it
            path = self.init_from.expanduser().resolve()
            if not path.is_file():
                fail(f"--init-from {self.init_from}: no such file", ExitCode.INVALID_INPUT)
            spec.init_from = str(path)
        return spec


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
    if opt.clip_grad_norm:
        parts.append(f"clip-norm={opt.clip_grad_norm:g}")
    if opt.clip_grad_value:
        parts.append(f"clip-value={opt.clip_grad_value:g}")
    if spec.micro_batches > 1:
        parts.append(f"micro-batches={spec.micro_batches}")
    return "".join(" " + p for p in parts)
