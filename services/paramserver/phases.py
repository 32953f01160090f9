"""Where a sync push's time goes on a primary, per phase, for the step timeline.

``stalwart bench ddp`` reads these sums and counts from ``/metrics`` before and
after a window of steps (:mod:`stalwart.bench.steptimeline`). Phases:

- ``receive``: header to the last chunk checked, assembled, found finite and
  forwarded to the backups;
- ``wait_slots``: a staged push waiting for the other slots (0 for the last one);
- ``apply``: sum in slot order + optimizer step on this replica;
- ``replicate``: the backups' commit round trip (runs alongside ``apply``);
- ``commit``: both of those, i.e. until the update is applied here and on the backups;
- ``answer``: after the push is acknowledged, building an answer that carries the
  next weights (the job's lock, the version's cached snapshot, the message), for
  pushes that ask for them (``PushHeader.answer_parameters_bytes``).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from typing import TypeVar

from prometheus_client import Summary

T = TypeVar("T")
PHASES = ("receive", "wait_slots", "apply", "replicate", "commit", "answer")
PHASE_SECONDS = Summary(
    "stalwart_paramserver_push_phase_seconds",
    "Seconds a sync push spends in each phase on this replica (see services/paramserver/phases.py).",
    ["phase"],
)
for _phase in PHASES:
    PHASE_SECONDS.labels(_phase)


def observe(phase: str, since: float) -> None:
    """Record ``perf_counter() - since`` under ``phase``."""
    PHASE_SECONDS.labels(phase).observe(time.perf_counter() - since)


async def timed(phase: str, awaitable: Awaitable[T]) -> T:
    started = time.perf_counter()
    try:
        return await awaitable
    finally:
        observe(phase, started)
