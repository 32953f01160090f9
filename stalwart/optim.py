"""Optimizers as torch.optim builds them from the wire spec (paramserver and reference runs alike).

Using torch.optim (single-tensor code path, ``foreach=False``) rather than a
re-implementation makes the numerics those of torch by construction; what this
module adds is validation of the wire spec and export/import of optimizer state
as named tensors, so replicas can copy and fingerprint it.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from stalwart.api import common
from stalwart.errors import ErrorKind, StalwartError
from stalwart.jobspec import validate_optimizer

# One validator for the wire spec, shared with the coordinator's job admission.
validate = validate_optimizer


def build(spec: common.OptimizerSpec, params: list[torch.Tensor]) -> torch.optim.Optimizer:
    """A torch optimizer over ``params`` (validated spec; wire zeros mean defaults).

    ``params`` may be empty: a shard group can hold none of a small model's stepped
    tensors (or only buffers). torch refuses an empty list but not one empty group,
    and one group is what it makes of a list anyway, so the numerics are the same."""
    validate(spec)
    groups = [{"params": list(params)}]
    if spec.kind == common.OPTIMIZER_KIND_SGD:
        return torch.optim.SGD(
            groups,
            lr=spec.lr,
            momentum=spec.momentum,
            dampening=spec.dampening,
            nesterov=spec.nesterov,
            weight_decay=spec.weight_decay,
            foreach=False,
        )
    cls = torch.optim.Adam if spec.kind == common.OPTIMIZER_KIND_ADAM else torch.optim.AdamW
    return cls(
        groups,
        lr=spec.lr,
        betas=(spec.beta1 or 0.9, spec.beta2 or 0.999),
        eps=spec.eps or 1e-8,
        weight_decay=spec.weight_decay,  # as given: 0 means no decay, for AdamW too
        foreach=False,
    )


def export_state(
    optimizer: torch.optim.Optimizer, names: Mapping[int, str]
) -> dict[str, torch.Tensor]:
    """Optimizer state as ``{"<param>/<key>": tensor}``; ``names`` maps id(param) to name."""
    out = {}
    for param, state in optimizer.state.items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                out[f"{names[id(param)]}/{key}"] = value
    return out


def import_state(
    optimizer: torch.optim.Optimizer,
    params: Mapping[str, torch.Tensor],
    state: Mapping[str, torch.Tensor],
) -> None:
    """Replace the optimizer's state with copies of ``state`` (as exported)."""
    optimizer.state.clear()
    for key, value in state.items():
        name, _, field = key.rpartition("/")
        if name not in params:
            raise StalwartError(ErrorKind.INVALID_ARGUMENT, f"optimizer state for unknown {name!r}")
        optimizer.state[params[name]][field] = value.clone()
