"""Refusals no retry of the trainer's mends, as errors of the job's own.

A model too large for the machine or the paramservers, and a gradient that is NaN
or Inf, would otherwise be retried for ever (the job RUNNING, never moving) or
allocated until the OOM killer ends the trainer. Each becomes a
``usererrors.UserCodeError`` of the step phase, reported like an exception in the
user's loss: the leader fails the job once two trainers report it at one step, or
one trainer three times (``services/coordinator/taskerrors.py``), so a single
faulty machine does not fail a job. A message must read the same from every
trainer, or the reports are not counted as one error.
"""

from __future__ import annotations

import math

import torch

from stalwart import meminfo, usererrors
from stalwart.api import coordinator
from stalwart.errors import RpcError, StalwartError
from stalwart.models import Task


def _job_error(
    error_type: str, message: str, slots: tuple[int, ...], step: int
) -> usererrors.UserCodeError:
    """The error, reported for the first of ``slots`` (-1 for a standby, which has none)."""
    error = usererrors.UserCodeError(usererrors.STEP, error_type, message)
    error.slot, error.step = (slots[0] if slots else -1), step
    return error


TRAINER_COPIES = 3  # of the parameters a trainer holds: the weights, a gradient, a pull


def meta_bytes(task: Task, seed: int) -> int | None:
    """The model's parameter and buffer bytes, from a build on torch's meta device
    (shapes only, nothing allocated); None when the model cannot be built there."""
    try:
        with torch.device("meta"):
            model = task.build_model(seed)
    except Exception:  # noqa: BLE001 - the real build reports the model's own errors
        return None
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def check_room(task: Task, spec: coordinator.JobSpec, slots: tuple[int, ...]) -> None:
    """Refuse to build a model this machine has no memory for: allocating it would have
    the kernel's OOM killer end the trainer, and then the next trainer given its slot."""
    params = meta_bytes(task, spec.seed)
    if params is None or TRAINER_COPIES * params <= meminfo.available_bytes():
        return
    raise _job_error(
        "ModelTooLarge",
        f"the model holds {params >> 20:,} MiB of parameters and buffers; a trainer needs "
        f"about {TRAINER_COPIES} times that, {usererrors.TRAINER_SHORT_OF_MEMORY}",
        slots,
        step=0,
    )


def cannot_run(err: StalwartError, slots: tuple[int, ...]) -> usererrors.UserCodeError:
    """A spec this trainer refused to run (``init_from`` unreadable or of another model):
    before, the trainer only logged it and kept the slot, and the job stood RUNNING."""
    return _job_error("JobSpecError", err.message, slots, step=0)


def too_large(err: RpcError, slots: tuple[int, ...]) -> usererrors.UserCodeError:
    """A model the paramservers refused for its size, as an error of the job's own: no
    retry makes it smaller, so the leader fails the job once two trainers (or one,
    three times) report it. The message must read the same from every trainer, so
    the room the paramserver had, which changes, is left out of it."""
    needed = err.metadata.get("needed_bytes")
    message = (
        f"the model needs about {int(needed) >> 20:,} MiB on a paramserver (parameters, "
        "optimizer state, a step's buffers and a staged push per slot), more than it has "
        "room for"
        if needed
        else f"a paramserver refused the model: {err.message}"
    )
    return _job_error("ModelTooLarge", message, slots, step=0)


def not_finite(model: torch.nn.Module, step: int, slot: int) -> usererrors.UserCodeError:
    """A gradient the paramserver refused for NaN or Inf, as an error of the job's own.

    Retrying cannot help when the weights themselves went non-finite (a learning rate
    too large: every trainer computes NaN from them for ever), so it is reported like
    an exception in the user's loss: the leader fails the job once two trainers report
    it at one step, or one trainer three times. A single bad computation (a faulty
    device) is reported once and the recomputed step goes through."""
    largest = max((float(p.detach().abs().max()) for p in model.parameters() if p.numel()),
                  default=0.0)  # fmt: skip
    if math.isfinite(largest):  # the same weights on every trainer: the same message
        message = (f"the gradient holds NaN or Inf; the weights it was computed from are "
                   f"finite, the largest {largest:.3g} in magnitude")  # fmt: skip
    else:
        message = ("the gradient holds NaN or Inf, and so do the weights it was computed "
                   "from: training diverged (a smaller learning rate, or gradient clipping, "
                   "may keep it finite)")  # fmt: skip
    return _job_error("NonFiniteGradient", message, (slot,), step)
