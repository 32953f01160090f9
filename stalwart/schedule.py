"""Learning-rate schedules: the rate of each update as a pure function of the version.

The paramserver sets the rate of the update that turns version ``v`` into
``v + 1`` just before running the optimizer, and ``reference_run`` does the same
with the same function, so every replica, every failover and every restore from
a checkpoint uses the same rate for the same version. Plain Python floats, no
torch: the rate is what torch.optim reads from ``param_groups[i]["lr"]``.

Warmup follows the convention of Hugging Face's ``get_*_schedule_with_warmup``:
``lr * v / warmup_steps`` for ``v < warmup_steps`` (the first update runs at
rate 0 and only moves Adam's moments).
"""

from __future__ import annotations

import math

from stalwart.api import common

CONSTANT = common.LR_SCHEDULE_KIND_CONSTANT
COSINE = common.LR_SCHEDULE_KIND_COSINE
LINEAR = common.LR_SCHEDULE_KIND_LINEAR
STEP = common.LR_SCHEDULE_KIND_STEP
DECAYING = (COSINE, LINEAR)  # kinds that need a decay horizon
DEFAULT_GAMMA = 0.1


def factor(s: common.LrSchedule, version: int) -> float:
    """Multiplier of ``lr`` for the update made from ``version``."""
    if version < s.warmup_steps:
        return version / s.warmup_steps
    after = version - s.warmup_steps
    if s.kind == STEP:
        return (s.gamma or DEFAULT_GAMMA) ** (after // s.step_size)
    if s.kind not in DECAYING:
        return 1.0
    progress = min(after / s.decay_steps, 1.0)
    shape = 0.5 * (1.0 + math.cos(math.pi * progress)) if s.kind == COSINE else 1.0 - progress
    return s.final_lr_ratio + (1.0 - s.final_lr_ratio) * shape


def rate(spec: common.OptimizerSpec, version: int) -> float:
    """The learning rate of the update that turns ``version`` into ``version + 1``."""
    if not spec.HasField("schedule"):
        return spec.lr
    return spec.lr * factor(spec.schedule, version)


def resolved(spec: common.OptimizerSpec, steps: int) -> common.OptimizerSpec:
    """A copy with a decaying schedule's horizon filled in from the job's ``steps``.

    Called on admission, by trainers before they register a model and by
    ``reference_run``; idempotent, so every caller registers the same spec.
    """
    out = common.OptimizerSpec()
    out.CopyFrom(spec)
    s = out.schedule
    if out.HasField("schedule") and s.kind in DECAYING and s.decay_steps == 0:
        s.decay_steps = max(steps - s.warmup_steps, 1)
    return out


def set_rate(optimizer, spec: common.OptimizerSpec, version: int) -> float:
    """Write the version's rate into every parameter group of a torch optimizer."""
    lr = rate(spec, version)
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr
