"""What happens to a combined gradient before the optimizer step (paramserver and reference alike).

One update's gradients are summed in slot order by the caller; this module
divides the sum for the MEAN reduction, clips it (by value, then by global
norm, with torch's own functions), and sets the scheduled learning rate. The
paramserver's ``JobModel.apply`` and ``training.reference_run`` both call
:func:`prepare_step`, which is what keeps them bitwise equal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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


def clip_(params: Mapping[str, torch.Tensor], spec: common.OptimizerSpec) -> float | None:
    """Clip the ``.grad`` of ``params`` as torch would; the pre-clip global norm, if asked.

    The tensors go to torch sorted by name: the global norm is a norm of the
    per-tensor norms, whose rounding depends on their order, and the paramserver
    holds a job's tensors in another order than the model has them.
    """
    params = [params[n] for n in sorted(params) if params[n].grad is not None]
    if spec.clip_grad_value:
        torch.nn.utils.clip_grad_value_(params, spec.clip_grad_value, foreach=False)
    if not spec.clip_grad_norm:
        return None
    norm = torch.nn.utils.clip_grad_norm_(params, spec.clip_grad_norm, foreach=False)
    return float(norm)


def prepare_step(
    optimizer: torch.optim.Optimizer,
    params: Mapping[str, torch.Tensor],
    summed: Mapping[str, torch.Tensor],
    count: int,
    version: int,
    spec: common.OptimizerSpec,
) -> float | None:
    """Everything between "the gradients are summed and set as ``.grad``" and ``step()``.

    ``params`` maps names to the tensors whose ``.grad`` are the very tensors of
    ``summed``; returns the
    global norm before clipping when clipping by norm.
    """
    reduce_(summed, count, spec)
    norm = clip_(params, spec)
    schedule.set_rate(optimizer, spec, version)
    return norm


def combine_buffers(values: Sequence[torch.Tensor]) -> torch.Tensor:
    """One buffer's new value from the values an update's pushes carry, in slot order.

    Floating point (running mean and variance): the mean, summed in slot order
    then divided. Integers (``num_batches_tracked``): the lowest slot's value,
    as every slot counts the same batches.
    """
    total = values[0].clone()
    if not total.is_floating_point():
        return total
    for value in values[1:]:
        total += value
    if len(values) > 1:
        total.div_(len(values))
    return total


# --- gradients on the wire (JobSpec.gradient_dtype) ----------------------------------


def wire_dtype(param: torch.dtype, gradient_dtype: int) -> torch.dtype:
    """The dtype the gradient of a ``param`` parameter travels in under
    ``JobSpec.gradient_dtype``: bfloat16 for a float32 parameter when the job says
    DTYPE_BFLOAT16 (rounded to nearest, ties to even), otherwise its own."""
    if gradient_dtype == common.DTYPE_BFLOAT16 and param == torch.float32:
        return torch.bfloat16
    return param


def narrowed(grads: Mapping[str, torch.Tensor], gradient_dtype: int) -> dict[str, torch.Tensor]:
    """Parameter gradients as a slot pushes them (:func:`wire_dtype`; no copy of those
    that keep their dtype)."""
    if gradient_dtype == common.DTYPE_UNSPECIFIED:
        return dict(grads)  # the default: no per-tensor call on the step's path
    return {n: g.to(wire_dtype(g.dtype, gradient_dtype)) for n, g in grads.items()}


def widened(
    grads: Mapping[str, torch.Tensor], dtypes: Mapping[str, torch.dtype]
) -> dict[str, torch.Tensor]:
    """Each gradient in its parameter's dtype (``dtypes``): a bfloat16 one widened to
    float32, which is exact; the others as they are (no copy). What the paramserver
    sums, and :func:`stalwart.training.reference_run` with it."""
    return {
        name: g if g.dtype == dtypes.get(name, g.dtype) else g.to(dtypes[name])
        for name, g in grads.items()
    }
