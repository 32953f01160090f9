"""Evaluation during training (JobSpec.eval_every), on the trainer of slot 0.

Between two of its steps, the trainer holding slot 0 evaluates the version it
just loaded when one is due (:func:`due`), and reports the metrics to the
job's first shard group (ParamServerService.RecordEvaluation), which keeps them
in the job's metric history. Slot 0 rather than a standby: in sync mode it
holds every version exactly, where a standby refreshes its weights only now
and then; every job has a slot 0, standby or not (docs/models.md,
"Evaluation and metrics").

Evaluation never changes training: it runs on a private copy of the model
(the task's ``evaluate`` may switch modes or touch buffers freely) and under
a forked global RNG seeded from (seed, version), so it consumes none of the
training's random numbers and gives the same metrics on every trainer. It
blocks the trainer's next step for as long as it takes: the other slots wait
at the step's commit, so frequent evaluation of a large held-out set slows
training; ``eval_every`` sets the trade.
"""

from __future__ import annotations

import asyncio
import math

import structlog
import torch

from stalwart import training
from stalwart.errors import RpcError, StalwartError
from stalwart.models.base import derive_seed, seeded_global_rng

log = structlog.get_logger(__name__)

MAX_METRICS = 16  # RecordEvaluation's limit: the rest are left out


def due(version: int, every: int, steps: int, previous: int) -> bool:
    """Evaluate ``version``? ``previous``: the version held before it (-1: none yet).

    Every ``every`` versions and the final one. In sync mode slot 0 holds every
    version, so that is exactly the multiples; where versions jump (async, or a
    takeover), the first version past a multiple stands for it.
    """
    if every <= 0 or version <= 0 or version == previous:
        return False
    if version >= steps:
        return True
    return version % every == 0 or (previous >= 0 and version // every > previous // every)


def clean(metrics: dict) -> dict[str, float]:
    """The finite float metrics, at most :data:`MAX_METRICS` of them, by name."""
    out: dict[str, float] = {}
    for name in sorted(metrics):
        try:
            value = float(metrics[name])
        except (TypeError, ValueError):
            continue
        if math.isfinite(value) and isinstance(name, str) and 0 < len(name) <= 64:
            out[name] = value
    return dict(list(out.items())[:MAX_METRICS])


class Evaluator:
    """Evaluates one job's versions as they are loaded; one per worker."""

    def __init__(self, device: str):
        self.device = device
        self._job_id = ""
        self._model: torch.nn.Module | None = None
        self._previous = -1

    async def between_steps(self, job, slots: tuple[int, ...]) -> None:
        """Called after the worker loaded a version; evaluates and reports it when due
        (by the trainer holding slot 0, however many slots it holds)."""
        if job.job_id != self._job_id:
            self._job_id, self._model, self._previous = job.job_id, None, -1
        previous, self._previous = self._previous, job.version
        spec = job.spec
        if 0 not in slots or not due(job.version, spec.eval_every, spec.steps, previous):
            return
        version = job.version
        try:
            metrics = await asyncio.get_running_loop().run_in_executor(None, self._evaluate, job)
        except Exception as err:  # the user's evaluate(): training goes on without it
            log.warning("evaluation failed", job=job.job_id, version=version,
                        error_type=type(err).__name__, error=str(err)[:500])  # fmt: skip
            return
        metrics = clean(metrics)
        if not metrics:
            log.warning("evaluation returned no finite metrics", job=job.job_id, version=version)
            return
        try:
            await job.client.record_evaluation(job.job_id, version, metrics)
        except (RpcError, StalwartError) as err:
            log.warning("evaluation not recorded", job=job.job_id, version=version, error=str(err))
            return
        log.info("evaluated", job=job.job_id, version=version, **metrics)

    def _evaluate(self, job) -> dict:
        """In the executor: the task's evaluate() on a copy holding the job's weights."""
        if self._model is None:
            self._model = job.task.build_model(job.spec.seed).to(self.device)
        state = dict(job.model.named_parameters())
        state.update(training.model_buffers(job.model))
        training.load_params(self._model, {n: t.detach() for n, t in state.items()})
        device = torch.device(self.device)
        devices = [device.index or 0] if device.type == "cuda" else []
        with seeded_global_rng(derive_seed(job.spec.seed, "eval", job.version), devices):
            return dict(job.task.evaluate(self._model))
