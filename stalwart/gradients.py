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

# the one narrowing there is: float32 gradients as bfloat16 (to nearest, ties to even)
WIRE_NARROWING = {torch.float32: torch.bfloat16}


def narrowed(grads: Mapping[str, torch.Tensor], wire_dtype: int) -> dict[str, torch.Tensor]:
    """Parameter gradients as a slot pushes them under ``JobSpec.gradient_dtype``: with
    DTYPE_BFLOAT16, every float32 one rounded to bfloat16; otherwise as they are."""
    if wire_dtype != common.DTYPE_BFLOAT16:
        return dict(grads)
    return {n: g.to(WIRE_NARROWING.get(g.dtype, g.dtype)) for n, g in grads.items()}


def accepts_on_wire(wire: torch.dtype, param: torch.dtype) -> bool:
    """May the gradient of a ``param`` parameter arrive as ``wire``? Its own dtype, or
    the one narrowing (a float32 parameter's gradient as bfloat16)."""
    return wire == param or WIRE_NARROWING.get(param) == wire


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
