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


def _bad(message: str) -> StalwartError:
    return StalwartError(ErrorKind.INVALID_ARGUMENT, f"optimizer: {message}")


def validate(spec: common.OptimizerSpec) -> None:
    kind = spec.kind
    if kind not in (
        common.OPTIMIZER_KIND_SGD,
        common.OPTIMIZER_KIND_ADAM,
        common.OPTIMIZER_KIND_ADAMW,
    ):
        raise _bad("kind must be SGD, ADAM or ADAMW")
    if not spec.lr > 0 or spec.lr != spec.lr:
        raise _bad(f"lr must be > 0, got {spec.lr}")
    if not spec.weight_decay >= 0:  # NaN too
        raise _bad(f"weight_decay must be >= 0, got {spec.weight_decay}")
    if kind == common.OPTIMIZER_KIND_SGD:
        if not 0 <= spec.momentum < 1:
            raise _bad(f"momentum must be in [0, 1), got {spec.momentum}")
        if not 0 <= spec.dampening <= 1:
            raise _bad(f"dampening must be in [0, 1], got {spec.dampening}")
        if spec.nesterov and (spec.momentum <= 0 or spec.dampening != 0):
            raise _bad("nesterov needs momentum > 0 and dampening 0")
        if spec.beta1 or spec.beta2 or spec.eps:
            raise _bad("beta1, beta2 and eps do not apply to SGD")
    else:
        for name in ("beta1", "beta2"):
            value = getattr(spec, name)
            if not 0 <= value < 1:
                raise _bad(f"{name} must be in [0, 1), got {value}")
        if not spec.eps >= 0:  # NaN too
            raise _bad(f"eps must be >= 0, got {spec.eps}")
        if spec.momentum or spec.dampening or spec.nesterov:
            raise _bad("momentum, dampening and nesterov do not apply to Adam")


def build(spec: common.OptimizerSpec, params: list[torch.Tensor]) -> torch.optim.Optimizer:
    """A torch optimizer over ``params`` (validated spec; wire zeros mean defaults)."""
    validate(spec)
    if spec.kind == common.OPTIMIZER_KIND_SGD:
        return torch.optim.SGD(
            params,
            lr=spec.lr,
            momentum=spec.momentum,
            dampening=spec.dampening,
            nesterov=spec.nesterov,
            weight_decay=spec.weight_decay,
            foreach=False,
        )
    cls = torch.optim.Adam if spec.kind == common.OPTIMIZER_KIND_ADAM else torch.optim.AdamW
    return cls(
        params,
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
