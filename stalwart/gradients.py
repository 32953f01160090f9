"""What happens to a combined gradient before the optimizer step (paramserver and reference alike).

One update's gradients are summed in slot order by the caller; this module
divides the sum for the MEAN reduction, clips it (by value, then by global
norm, with torch's own functions), and sets the scheduled learning rate. The
paramserver's ``JobModel.apply`` and ``training.reference_run`` both call
:func:`prepare_step`, which is what keeps them bitwise equal.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from stalwart import schedule
from stalwart.api import common


def reduce_(summed: Mapping[str, torch.Tensor], count: int, spec: common.OptimizerSpec) -> None:
    """Turn the slot-order sum of ``count`` gradients into the spec's reduction, in place."""
    if spec.reduction == common.GRAD_REDUCTION_SUM or count == 1:
        return
    for grad in summed.values():
        if grad.is_floating_point():
            grad.div_(count)


def clip_(params: Iterable[torch.Tensor], spec: common.OptimizerSpec) -> float | None:
    """Clip the ``.grad`` of ``params`` as torch would; the pre-clip global norm, if asked."""
    params = [p for p in params if p.grad is not None]
    if spec.clip_grad_value:
        torch.nn.utils.clip_grad_value_(params, spec.clip_grad_value, foreach=False)
    if not spec.clip_grad_norm:
        return None
    norm = torch.nn.utils.clip_grad_norm_(params, spec.clip_grad_norm, foreach=False)
    return float(norm)


def prepare_step(
    optimizer: torch.optim.Optimizer,
    params: Iterable[torch.Tensor],
    summed: Mapping[str, torch.Tensor],
    count: int,
    version: int,
    spec: common.OptimizerSpec,
) -> float | None:
    """Everything between "the gradients are summed and set as ``.grad``" and ``step()``.

    ``summed`` holds the very tensors set as ``.grad`` of ``params``; returns the
    global norm before clipping when clipping by norm.
    """
    reduce_(summed, count, spec)
    norm = clip_(params, spec)
    schedule.set_rate(optimizer, spec, version)
    return norm
