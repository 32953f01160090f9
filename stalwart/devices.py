"""Which torch device a trainer computes on: the decision alone (no torch import).

``--device`` takes ``auto`` (a GPU when there is one, else the CPU), ``cpu``,
``cuda`` (a GPU, required) or ``cuda:N`` (that GPU). ``auto`` and ``cuda`` give
one GPU per trainer: the trainer's local index (its position among the trainers
of its machine, torchrun's ``LOCAL_RANK``) modulo the GPUs it can see, so four
trainers on four GPUs take one each, and more trainers than GPUs share them
round-robin instead of refusing to start. ``cuda:N`` names one GPU and is an
error when that GPU is not there, as is ``cuda`` without any: a job asked to run
on a GPU never falls back to the CPU silently.

The trainer calls :func:`select` once at start-up with ``torch.cuda.device_count()``
(0 without CUDA) and exits 2 with the message of a :class:`DeviceError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

KINDS = ("auto", "cpu", "cuda")


class DeviceError(ValueError):
    """A device choice this machine cannot honour, or one that does not parse."""


@dataclass(frozen=True)
class DeviceChoice:
    kind: str  # one of KINDS
    index: int | None = None  # cuda:N; None: chosen by local index

    def __str__(self) -> str:
        return self.kind if self.index is None else f"{self.kind}:{self.index}"


def parse(text: str) -> DeviceChoice:
    """``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (N >= 0), any case, spaces ignored."""
    value = text.strip().lower()
    kind, sep, index = value.partition(":")
    if not sep and kind in KINDS:
        return DeviceChoice(kind)
    if kind == "cuda" and sep and index.isdigit():  # isdigit: no sign, no spaces
        return DeviceChoice("cuda", int(index))
    raise DeviceError(f"device {text!r}: expected auto, cpu, cuda or cuda:N (N >= 0)")


def select(choice: DeviceChoice, local_index: int, cuda_count: int) -> str:
    """The torch device string for a trainer with ``local_index`` seeing ``cuda_count`` GPUs."""
    if local_index < 0:
        raise DeviceError(f"local index {local_index} is negative")
    if choice.kind == "cpu" or (choice.kind == "auto" and cuda_count == 0):
        return "cpu"
    if cuda_count == 0:
        raise DeviceError(f"device {choice}: no CUDA device is visible on this machine")
    if choice.index is None:
        return f"cuda:{local_index % cuda_count}"
    if choice.index >= cuda_count:
        seen = "1 CUDA device is" if cuda_count == 1 else f"{cuda_count} CUDA devices are"
        raise DeviceError(f"device {choice}: only {seen} visible (cuda:0 to cuda:{cuda_count - 1})")
    return f"cuda:{choice.index}"


def local_index(configured: int | None, environ: Mapping[str, str]) -> int:
    """The configured index, else torchrun's ``LOCAL_RANK`` from ``environ``, else 0."""
    if configured is not None:
        return configured
    raw = environ.get("LOCAL_RANK", "").strip()
    if not raw:
        return 0
    if not raw.isdigit():
        raise DeviceError(f"LOCAL_RANK={raw!r} is not a non-negative integer")
    return int(raw)
