"""User tasks named ``package.module:function``, imported from this process's own path.

Only the name crosses the wire; the code must already be installed where the
trainer runs (DESIGN.md: nothing executable crosses the wire). The function is
called with the ``JobSpec`` and returns a Task-like object.
"""

from __future__ import annotations

import importlib
import re

from stalwart.api import coordinator
from stalwart.modelargs import invalid
from stalwart.models.base import TASK_METHODS, Task

# dotted identifiers, a colon, one identifier: nothing else is ever imported
_REFERENCE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")


def is_reference(model: str) -> bool:
    return ":" in model


def load(spec: coordinator.JobSpec) -> Task:
    """Import the module, call the function with the spec, check the result."""
    if not _REFERENCE.match(spec.model):
        raise invalid(f"model {spec.model!r} is not of the form package.module:function")
    module_name, _, attr = spec.model.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise invalid(
            f"model {spec.model!r}: cannot import {module_name!r} on this node ({exc})"
        ) from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise invalid(f"model {spec.model!r}: {module_name} has no callable {attr!r}")
    task = factory(spec)
    missing = [m for m in TASK_METHODS if not callable(getattr(task, m, None))]
    if missing:
        raise invalid(f"model {spec.model!r}: returned object lacks {', '.join(missing)}")
    return task
