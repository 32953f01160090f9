"""Model weights as files: export (safetensors or torch) and a job's start from a file.

safetensors holds tensors and nothing executable, so a file read to start a job
(``JobSpec.init_from``) can never run code; the torch format is written for
users' own ``torch.load(..., weights_only=True)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from stalwart.errors import ErrorKind, StalwartError

FORMATS = ("safetensors", "torch")


def save(
    tensors: Mapping[str, torch.Tensor],
    path: Path,
    fmt: str = "safetensors",
    metadata: Mapping[str, str] | None = None,
) -> int:
    """Write ``tensors`` (CPU copies, contiguous) to ``path``; returns the bytes of data.
    ``metadata`` goes into a safetensors header (the torch format has no place for it)."""
    if not Path(path).parent.is_dir():  # safetensors' own error names no path
        raise StalwartError(ErrorKind.INVALID_ARGUMENT, f"{Path(path).parent} is not a folder")
    data = {n: t.detach().to("cpu").contiguous() for n, t in tensors.items()}
    if fmt == "safetensors":
        from safetensors.torch import save_file

        save_file(data, str(path), metadata=dict(metadata) if metadata else None)
    elif fmt == "torch":
        torch.save(data, path)
    else:
        raise StalwartError(ErrorKind.INVALID_ARGUMENT, f"format must be one of {FORMATS}")
    return sum(t.numel() * t.element_size() for t in data.values())


def load(path: str | Path) -> dict[str, torch.Tensor]:
    """Tensors of a file written by :func:`save` (safetensors, or torch with weights_only)."""
    from safetensors import SafetensorError

    try:
        if str(path).endswith(".safetensors"):
            from safetensors.torch import load_file

            return load_file(str(path))
        return torch.load(path, map_location="cpu", weights_only=True)
    # missing, unreadable or not tensors; a file that is no safetensors at all raises
    # SafetensorError, which ended the trainer that read it
    except (OSError, RuntimeError, ValueError, SafetensorError) as exc:
        message = f"cannot read weights {path}: {exc}"
        raise StalwartError(ErrorKind.INVALID_ARGUMENT, message) from exc


def overlay(initial: Mapping[str, torch.Tensor], path: str | Path) -> dict[str, torch.Tensor]:
    """``initial`` with every tensor replaced by the file's; each must be there, same spec."""
    saved = load(path)
    out = {}
    for name, want in initial.items():
        got = saved.get(name)
        if got is None:
            raise StalwartError(ErrorKind.INVALID_ARGUMENT, f"{path} has no tensor {name!r}")
        if got.shape != want.shape or got.dtype != want.dtype:
            raise StalwartError(
                ErrorKind.INVALID_ARGUMENT,
                f"{path}: {name} is {got.dtype} {list(got.shape)}, "
                f"the model has {want.dtype} {list(want.shape)}",
            )
        out[name] = got.clone()
    return out
