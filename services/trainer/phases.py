"""Where a trainer's sync step goes, per phase, for the step timeline.

``stalwart bench ddp`` reads these sums and counts from ``/metrics``
(:mod:`stalwart.bench.steptimeline`). Phases:

- ``pull``: the pull call: request, the paramserver's snapshot, the chunks'
  transfer, CRC checks and reassembly (deserialise);
- ``load``: copying the pulled tensors into the model;
- ``compute``: forward and backward of the slot's batch;
- ``push``: the push call until acknowledged: serialise, send, and everything the
  primary does (:mod:`services.paramserver.phases`: waiting for the other slots,
  apply, replicate).
"""

from __future__ import annotations

import time

from prometheus_client import Summary

PHASES = ("pull", "load", "compute", "push")
PHASE_SECONDS = Summary(
    "stalwart_trainer_step_phase_seconds",
    "Seconds a trainer's step spends in each phase (see services/trainer/phases.py).",
    ["phase"],
)
for _phase in PHASES:
    PHASE_SECONDS.labels(_phase)


def observe(phase: str, since: float) -> None:
    """Record ``perf_counter() - since`` under ``phase``."""
    PHASE_SECONDS.labels(phase).observe(time.perf_counter() - since)
