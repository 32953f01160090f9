"""Algorithm-based fault tolerance (ABFT) for linear layers: checksums of matmuls.

For ``y = x W^T + b`` (x: [..., in], W: [out, in]) the row sums of ``y`` must
equal ``x · (W^T 1) + sum(b)``: one extra matrix-vector product checks the
whole matrix product (Huang & Abraham's checksum idea). In backward, the column
sums of the weight gradient ``dW = g^T x`` must equal ``x^T (g 1)``.

The checks only *read* the layer's inputs and outputs (forward hook, tensor
hooks), never replace its arithmetic, so gradients stay bitwise identical to an
unchecked run. A sum over ``in`` float32 products carries rounding, so the
comparison has a tolerance scaled by the magnitudes involved: it catches an
error larger than about ``rtol`` of a row's magnitude (an exponent or high
mantissa bit flip, a wrong tile), not a flip of the lowest mantissa bits, which
is what duplicate computation is for.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch
from torch import nn

from stalwart.errors import ErrorKind, StalwartError

# Tolerance relative to a Cauchy-Schwarz scale of each checksum (norms cost one
# pass and no temporary, unlike sums of absolute values). On float32 the clean
# error measured at most 5e-8 (forward) and 2e-7 (dW) of that scale for widths
# 256-1024 and inputs over four orders of magnitude: 4e-6 leaves a 20x margin.
RTOL = 4e-6
ATOL = 1e-12


class AbftError(StalwartError):
    """A checksum did not match: the matmul's result is corrupt."""

    def __init__(self, message: str):
        super().__init__(ErrorKind.CHECKSUM_MISMATCH, message)


def _mismatch(got: torch.Tensor, want: torch.Tensor, scale: torch.Tensor, rtol: float):
    """Largest violation of |got - want| <= rtol*scale + atol, or None when all hold."""
    err = (got - want).abs() - (rtol * scale + ATOL)
    worst = float(err.max()) if err.numel() else 0.0
    if worst > 0 or worst != worst:  # NaN compares false: treat it as a mismatch
        return worst
    return None


def check_forward(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, y: torch.Tensor,
    rtol: float = RTOL,
) -> None:  # fmt: skip
    """Raise AbftError unless y's row sums match x·(W^T 1) (+ sum b)."""
    with torch.no_grad():
        wsum = weight.sum(0)  # W^T 1: [in]
        want = x @ wsum
        if bias is not None:
            want = want + bias.sum()
        got = y.sum(-1)
        # |x_i . W_j| <= |x_i| |W_j|, summed over j: |x_i| |W|_F sqrt(out) bounds the sum;
        # rounding grows like its square root, so |x_i| |W|_F is the scale.
        scale = torch.linalg.vector_norm(x, dim=-1) * torch.linalg.vector_norm(weight)
        if bias is not None:
            scale = scale + torch.linalg.vector_norm(bias) * bias.numel() ** 0.5
        worst = _mismatch(got, want, scale, rtol)
    if worst is not None:
        raise AbftError(f"ABFT forward checksum mismatch in a linear layer (excess {worst:.3g})")


def check_weight_grad(
    x: torch.Tensor, g: torch.Tensor, dweight: torch.Tensor, rtol: float = RTOL
) -> None:
    """Raise AbftError unless dW's column sums match x^T (g 1)."""
    with torch.no_grad():
        x2 = x.reshape(-1, x.shape[-1])
        gsum = g.reshape(-1, g.shape[-1]).sum(-1)  # g 1: [N]
        want = gsum @ x2
        got = dweight.sum(0)
        # Not |g 1|: a softmax's output gradient sums to ~0 per row, while the
        # rounding of dW's entries follows |g|.
        scale = torch.linalg.vector_norm(g) * torch.linalg.vector_norm(x2, dim=0)
        worst = _mismatch(got, want, scale, rtol)
    if worst is not None:
        raise AbftError(f"ABFT weight-gradient checksum mismatch (excess {worst:.3g})")


@dataclass
class AbftStats:
    """Checks made and failed, for metrics and the bench."""

    checks: int = 0
    failures: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, failed: bool) -> None:
        with self.lock:
            self.checks += 1
            self.failures += int(failed)


class _LinearGuard:
    """Hooks of one nn.Linear: checks forward, and dW when the weight needs a gradient."""

    def __init__(self, module: nn.Linear, stats: AbftStats, backward: bool):
        self.module = module
        self.stats = stats
        self.backward = backward

    def __call__(self, module: nn.Linear, inputs, output: torch.Tensor) -> None:
        x = inputs[0]
        self._run(check_forward, x, module.weight, module.bias, output)
        if self.backward and torch.is_grad_enabled() and module.weight.requires_grad:
            self._watch_backward(x.detach(), output, module.weight)

    def _watch_backward(self, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor) -> None:
        seen: dict[str, torch.Tensor] = {}

        def on_output_grad(g: torch.Tensor) -> None:
            seen["g"] = g.detach()  # y's gradient arrives before the layer's backward

        def on_weight_grad(dw: torch.Tensor) -> None:
            handle.remove()  # one-shot: the next forward registers its own
            if "g" in seen:
                self._run(check_weight_grad, x, seen.pop("g"), dw.detach())

        y.register_hook(on_output_grad)
        handle = weight.register_hook(on_weight_grad)

    def _run(self, check, *args) -> None:
        try:
            check(*args)
        except AbftError:
            self.stats.count(True)
            raise
        self.stats.count(False)


def protect(model: nn.Module, backward: bool = True) -> tuple[AbftStats, list]:
    """Check every nn.Linear of ``model``; returns the stats and the hook handles.

    ``handle.remove()`` for each handle turns the checks off again.
    """
    stats = AbftStats()
    handles = [
        m.register_forward_hook(_LinearGuard(m, stats, backward))
        for m in model.modules()
        if isinstance(m, nn.Linear)
    ]
    return stats, handles
