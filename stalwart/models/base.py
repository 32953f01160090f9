"""What a trainable job is: the Task protocol, and the pure seeding every task shares.

A slot's batch for a step must be a pure function of (seed, slot, step) so that
any trainer, at any time, computes the same gradient for it (DESIGN.md
invariant 4). Tasks therefore never touch the global RNG: every draw comes
from a ``torch.Generator`` seeded by :func:`derive_seed`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import struct
import threading
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch

_MASK63 = (1 << 63) - 1


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed from any mix of ints and strings, the same on every machine.

    A cryptographic hash rather than arithmetic mixing, so that nearby inputs
    ((seed, 0, 1) and (seed, 1, 0)) give unrelated streams.
    """
    h = hashlib.blake2b(digest_size=8)
    for part in parts:
        if isinstance(part, str):
            data = part.encode()
            h.update(b"s" + struct.pack("<I", len(data)) + data)
        else:
            # 9 signed bytes hold any uint64 (the wire seed) and any int64
            h.update(b"i" + int(part).to_bytes(9, "little", signed=True))
    return int.from_bytes(h.digest(), "little") & _MASK63


def generator(*parts: int | str) -> torch.Generator:
    """A CPU generator seeded from ``parts``; CPU so that draws match on every device."""
    g = torch.Generator(device="cpu")
    g.manual_seed(derive_seed(*parts))
    return g


@runtime_checkable
class Task(Protocol):
    """A model, its data and its loss. Built-ins live in :mod:`stalwart.models`."""

    def build_model(self, seed: int) -> torch.nn.Module:
        """The model with its seeded initial weights, identical on every machine."""
        ...

    def batch(
        self, seed: int, slot: int, step: int, batch_size: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets of one slot's batch for one step (CPU tensors), a pure function."""
        ...

    def loss(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Scalar loss of ``model`` on a batch."""
        ...

    def evaluate(self, model: torch.nn.Module) -> dict[str, float]:
        """Held-out metrics, e.g. ``{"accuracy": 0.98, "loss": 0.07}``."""
        ...


TASK_METHODS = ("build_model", "batch", "loss", "evaluate")


def seeded_module(seed: int, build) -> torch.nn.Module:
    """Run ``build()`` with the global RNG forked and seeded, so init is reproducible.

    torch.nn layers draw their initial weights from the global generator; the
    fork restores the caller's RNG state afterwards, so building a model never
    disturbs anything else.
    """
    with seeded_global_rng(derive_seed(seed, "init")):
        return build()


# torch has one global generator per process. A trainer draws from it on more than
# one thread (the step, a duplicate-compute check, an evaluation), and fork_rng
# saves and restores that one state: two seeded sections at once would mix their
# draws and break the same-mask-on-every-trainer promise. They take turns.
_GLOBAL_RNG_TURN = threading.RLock()


@contextlib.contextmanager
def seeded_global_rng(seed: int, cuda_devices: Sequence[int] = ()):
    """The global RNG (CPU and the given GPUs) forked and seeded with ``seed``, held by
    this thread alone until the block ends; the caller's RNG state comes back after."""
    with _GLOBAL_RNG_TURN, torch.random.fork_rng(devices=list(cuda_devices)):
        if _cuda_impossible():
            # what torch.manual_seed does here, without queueing the GPUs' seeding
            # for a CUDA start that cannot come (with a formatted stack trace, which
            # reads every frame's source file: ~100 us, once per slot and step)
            torch.default_generator.manual_seed(seed)
        else:
            torch.manual_seed(seed)
        yield


@functools.cache
def _cuda_impossible() -> bool:
    """No NVIDIA driver on this machine and CUDA not started: nothing CUDA ever runs
    here. Read from the driver's files, never by asking CUDA (which would start its
    driver in this process and break CUDA in processes forked from it)."""
    if torch.cuda.is_initialized():
        return False
    return not any(os.path.exists(p) for p in ("/dev/nvidiactl", "/proc/driver/nvidia/version"))


def accuracy_and_loss(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 1024
) -> dict[str, float]:
    """Classification accuracy and mean cross-entropy, in batches, on the model's device."""
    device = next(model.parameters()).device
    correct, total_loss = 0, 0.0
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for start in range(0, len(x), batch):
            xb, yb = x[start : start + batch].to(device), y[start : start + batch].to(device)
            logits = model(xb)
            total_loss += torch.nn.functional.cross_entropy(logits, yb, reduction="sum").item()
            correct += (logits.argmax(dim=1) == yb).sum().item()
    model.train(was_training)
    return {"accuracy": correct / len(x), "loss": total_loss / len(x), "examples": float(len(x))}
