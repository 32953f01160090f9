"""Client SDK: the public way to talk to Stalwart services from Python.

Names are imported on first use, so ``from stalwart.client import CoordinatorClient``
does not pay for torch (which the parameter-server client needs).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ParamServerClient": "stalwart.client.paramserver",
    "ShardGroupClient": "stalwart.client.paramserver",
    "CoordinatorClient": "stalwart.client.coordinator",
    "NodeSession": "stalwart.client.coordinator",
    "JobMetricsReader": "stalwart.client.jobmetrics",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'stalwart.client' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
