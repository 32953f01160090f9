"""The InfiniteHBD GPU-cluster fault trace, and the rate and duration fits taken from it.

The trace (StepFun, SIGCOMM 2025) lists fault starts and ends on 400 servers over 348 days.
We fit:

- **rate**: faults per GPU-hour = faults / (servers x 8 GPUs x observed hours), a Poisson
  rate (the coefficient of variation of the gaps between cluster-wide fault starts is
  reported so the exponential assumption can be judged). Rows that are operations on a
  node rather than faults (stress tests, changes, tests) are left out.
- **cause mix**: the share of each class, each mapped to how it shows (crash, hang, silent).
- **repair duration** (start to end, per fault): a lognormal by maximum likelihood (mean and
  standard deviation of the log-hours), truncated at the longest repair seen.

Read from ``$STALWART_DATA_DIR/infinitehbd-fault-trace`` (default ``../shared/data`` beside
the repository); a missing trace raises :class:`TraceMissing` whose message says where to get it.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from stalwart.datadir import data_dir
from stalwart.sim import published

NAME = "infinitehbd-fault-trace"
SOURCE = "github.com/stepfun-ai/InfiniteHBD-Trace (fault_trace.json)"
SERVERS = 400


class TraceMissing(FileNotFoundError):
    """The trace is not on disk; the message says where to get it."""


@dataclass(frozen=True)
class TraceFit:
    faults: int
    observed_days: float
    rate_per_gpu_hour: float
    gap_cv: float  # coefficient of variation of gaps between fault starts (1.0 for Poisson)
    causes: tuple[published.Cause, ...]
    repair_log_mu: float  # ln(hours)
    repair_log_sigma: float
    repair_max_h: float
    repair_median_h: float

    def to_dict(self) -> dict:
        return {
            "source": SOURCE,
            "faults": self.faults,
            "observed_days": round(self.observed_days, 2),
            "rate_per_gpu_hour": self.rate_per_gpu_hour,
            "gap_cv": round(self.gap_cv, 3),
            "repair_lognormal_mu_ln_h": round(self.repair_log_mu, 3),
            "repair_lognormal_sigma": round(self.repair_log_sigma, 3),
            "repair_median_h": round(self.repair_median_h, 2),
            "repair_max_h": round(self.repair_max_h, 1),
        }


def load(path: Path | None = None) -> list[dict]:
    folder = path or data_dir() / NAME
    file = folder / "fault_trace.json"
    if not file.is_file():
        raise TraceMissing(
            f"{NAME} not found at {folder}: get fault_trace.json from {SOURCE} "
            f"(layout in shared/data/{NAME}/README.md) or set STALWART_DATA_DIR"
        )
    return json.loads(file.read_text())


def pair_faults(events: list[dict]) -> list[tuple[float, float, dict]]:
    """(start_day, end_day, fault_type) per fault: each end closes its node's open fault
    of the same type (the trace has no fault id)."""
    open_faults: dict[str, list[tuple[float, dict]]] = {}
    faults = []
    for ev in events:
        pending = open_faults.setdefault(ev["node_id"], [])
        if ev["event_type"] == "fault_start":
            pending.append((ev["event_time"], ev["fault_type"]))
            continue
        for i, (start, kind) in enumerate(pending):
            if kind == ev["fault_type"]:
                faults.append((start, ev["event_time"], kind))
                del pending[i]
                break
    return sorted(faults, key=lambda f: f[0])


def _is_fault(kind: dict) -> bool:
    return (kind["Level"], kind["Class"]) not in published.TRACE_NOT_FAULTS


def _cause_of(kind: dict) -> tuple[str, str, str, bool]:
    if kind.get("Desc") == published.TRACE_SILENT_DESC:
        return f"{kind['Class']}: {kind['Desc']}", "silent", "node", False
    manifest, scope, precursor = published.TRACE_CLASS_KIND.get(
        (kind["Level"], kind["Class"]), ("crash", "node", False)
    )
    name = f"{kind['Class']}: {kind['Desc']}" if kind["Level"] == "Other Failure" else kind["Class"]
    return name, manifest, scope, precursor


def fit(events: list[dict]) -> TraceFit:
    faults = [f for f in pair_faults(events) if _is_fault(f[2])]
    days = max(ev["event_time"] for ev in events)  # the window runs from day 0
    gpu_hours = SERVERS * published.TRACE_GPUS_PER_SERVER * days * 24
    starts = [f[0] for f in faults]
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    counts = Counter(_cause_of(f[2]) for f in faults)
    causes = tuple(
        published.Cause(name, n, manifest, scope, pre)
        for (name, manifest, scope, pre), n in counts.most_common()
    )
    hours = [max((end - start) * 24, 1e-3) for start, end, _ in faults]
    logs = [math.log(h) for h in hours]
    return TraceFit(
        faults=len(faults),
        observed_days=days,
        rate_per_gpu_hour=len(faults) / gpu_hours,
        gap_cv=statistics.pstdev(gaps) / statistics.mean(gaps),
        causes=causes,
        repair_log_mu=statistics.mean(logs),
        repair_log_sigma=statistics.pstdev(logs),
        repair_max_h=max(hours),
        repair_median_h=statistics.median(hours),
    )


def load_fit(path: Path | None = None) -> TraceFit:
    return fit(load(path))
