"""Failure processes: what happens to the hardware, sampled once per (seed, N) and then
replayed to every strategy, so strategies differ only in how they respond.

Hard failures are a Poisson process whose rate grows linearly with the GPU count (the
"nodes in series" model both Meta papers use); each picks a cause from the mix and a node
uniformly. Gray failures (a node that keeps working, slower) are a second, independent
Poisson process. Planned maintenance, where a source reports it, is a third.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field

from stalwart.sim import published, trace

HOUR = 3600.0
DAY = 86400.0


@dataclass(frozen=True)
class FailureModel:
    """Where failures come from; ``rate_per_gpu_hour`` scales linearly with N."""

    source: str
    rate_per_gpu_hour: float
    causes: tuple[published.Cause, ...]
    planned_per_gpu_hour: float = 0.0
    # node repair time (a failed node back in service): lognormal in hours, truncated
    repair_log_mu: float = 3.2  # replaced by the trace fit when the trace is on disk
    repair_log_sigma: float = 2.7
    repair_max_h: float = 3000.0
    # gray failures: a separate process, as a share of the hard-failure rate
    gray_per_failure: float = 0.5
    gray_slowdown: tuple[float, float] = (1.2, 2.0)  # step-time factor, uniform
    gray_duration_h: float = 24.0  # mean, exponential: how long a slow node stays slow
    notes: tuple[str, ...] = field(default=())

    def mtbf_h(self, gpus: int) -> float:
        return 1.0 / (self.rate_per_gpu_hour * gpus)

    def to_dict(self, gpus: list[int]) -> dict:
        total = sum(c.count for c in self.causes)
        return {
            "source": self.source,
            "rate_per_gpu_hour": self.rate_per_gpu_hour,
            "mtbf_h": {n: round(self.mtbf_h(n), 3) for n in gpus},
            "planned_per_gpu_hour": self.planned_per_gpu_hour,
            "causes": [{"name": c.name, "share": round(c.count / total, 4), "manifest": c.manifest,
                        "scope": c.scope, "precursor": c.precursor} for c in self.causes],
            "repair_lognormal_h": {"mu_ln_h": round(self.repair_log_mu, 3),
                                   "sigma": round(self.repair_log_sigma, 3),
                                   "max_h": self.repair_max_h},
            "gray": {"per_hard_failure": self.gray_per_failure,
                     "slowdown": list(self.gray_slowdown), "mean_duration_h": self.gray_duration_h},
            "notes": list(self.notes),
        }  # fmt: skip


def llama3(fit: trace.TraceFit | None) -> FailureModel:
    """Llama 3's cause mix and rate (419 unexpected + 47 planned in 54 days on 16,384 GPUs)."""
    gpu_hours = published.LLAMA3_GPUS * published.LLAMA3_DAYS * 24
    return _with_repair(
        FailureModel(
            source=published.LLAMA3_SOURCE,
            rate_per_gpu_hour=419 / gpu_hours,
            causes=published.LLAMA3_CAUSES,
            planned_per_gpu_hour=published.LLAMA3_PLANNED / gpu_hours,
        ),
        fit,
    )


def meta(fit: trace.TraceFit | None) -> FailureModel:
    """Meta RSC-1's failures per node-day, with Llama 3's cause mix."""
    rate = published.META_FAILURES_PER_1000_NODE_DAYS / 1000 / 8 / 24
    return _with_repair(
        FailureModel(source=f"{published.META_SOURCE}; causes: {published.LLAMA3_SOURCE}",
                     rate_per_gpu_hour=rate, causes=published.LLAMA3_CAUSES),
        fit,
    )  # fmt: skip


def from_trace(fit: trace.TraceFit) -> FailureModel:
    """Rate, cause mix and repair times all fitted from the InfiniteHBD trace."""
    return _with_repair(
        FailureModel(source=trace.SOURCE, rate_per_gpu_hour=fit.rate_per_gpu_hour,
                     causes=fit.causes,
                     notes=("node faults only: the trace holds no job-wide software bugs",)),
        fit,
    )  # fmt: skip


def _with_repair(model: FailureModel, fit: trace.TraceFit | None) -> FailureModel:
    if fit is None:
        return model
    return dataclasses.replace(
        model,
        repair_log_mu=fit.repair_log_mu,  # ln(hours)
        repair_log_sigma=fit.repair_log_sigma,
        repair_max_h=fit.repair_max_h,
    )


@dataclass(frozen=True)
class Event:
    """One thing that happens to the hardware. ``kind``: fail | gray | planned."""

    t: float
    kind: str
    node: int
    cause: published.Cause | None = None
    repair_s: float = 0.0
    slowdown: float = 1.0
    duration_s: float = 0.0
    draw: float = 0.0  # a uniform draw the strategies share (prediction hit, shard choice)
    lead_draw: float = 0.0  # an exponential(1) draw for the prediction lead time


def _poisson_times(rng: random.Random, rate_per_s: float, horizon_s: float):
    t = 0.0
    if rate_per_s <= 0:
        return
    while True:
        t += rng.expovariate(rate_per_s)
        if t >= horizon_s:
            return
        yield t


def sample(model: FailureModel, gpus: int, gpus_per_node: int, horizon_s: float,
           seed: int) -> list[Event]:  # fmt: skip
    """Every hard, gray and planned event for one job, sorted by time. Each process has its
    own random stream (seeded from ``seed`` and N), so changing one leaves the others alone."""
    nodes = max(1, gpus // gpus_per_node)
    weights = [c.count for c in model.causes]
    out: list[Event] = []
    rng = random.Random(f"fail:{seed}:{gpus}")
    for t in _poisson_times(rng, model.rate_per_gpu_hour * gpus / HOUR, horizon_s):
        cause = rng.choices(model.causes, weights)[0]
        hours = min(rng.lognormvariate(model.repair_log_mu, model.repair_log_sigma),
                    model.repair_max_h)  # fmt: skip
        out.append(Event(t, "fail", rng.randrange(nodes), cause, repair_s=hours * HOUR,
                         draw=rng.random(), lead_draw=rng.expovariate(1.0)))  # fmt: skip
    rng = random.Random(f"gray:{seed}:{gpus}")
    gray_rate = model.gray_per_failure * model.rate_per_gpu_hour * gpus / HOUR
    for t in _poisson_times(rng, gray_rate, horizon_s):
        out.append(Event(t, "gray", rng.randrange(nodes), slowdown=rng.uniform(*model.gray_slowdown),
                         duration_s=rng.expovariate(1.0 / (model.gray_duration_h * HOUR))))  # fmt: skip
    rng = random.Random(f"planned:{seed}:{gpus}")
    for t in _poisson_times(rng, model.planned_per_gpu_hour * gpus / HOUR, horizon_s):
        out.append(Event(t, "planned", rng.randrange(nodes)))
    out.sort(key=lambda e: (e.t, e.kind))
    return out


def rollback_rate_per_s(model: FailureModel, gpus: int, node_scope_rolls_back: bool) -> float:
    """Rate of failures that send a job back to its last checkpoint: every failure for a
    job that restarts everything, only job-scope and silent ones for one that does not."""
    total = sum(c.count for c in model.causes)
    share = sum(c.count for c in model.causes
                if node_scope_rolls_back or c.scope == "job" or c.manifest == "silent") / total  # fmt: skip
    return share * model.rate_per_gpu_hour * gpus / HOUR
