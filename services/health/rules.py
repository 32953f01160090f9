"""Rules a node's recent telemetry is held to: hardware faults and straggling (pure).

Each rule looks at one node's window (and, for straggling, its peers') and returns
:class:`Finding`s with a risk in [0, 1]; the node's risk is the largest one. Risk
1 means "expect it to fail now"; the drain threshold (default 0.8) is where the
coordinator moves its work away.

Metric names follow the Prometheus convention the trainers report
(docs/models.md): ``gpu_temperature_celsius``, ``step_time_seconds``, and
cumulative counters ending in ``_total``.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from services.health.window import NodeWindow

# NVIDIA Xid codes that mean the GPU (or its memory or links) is failing, not a
# software fault: 48 double-bit ECC, 63/64 row remapping, 74 NVLink, 79 fell off
# the bus, 92 high single-bit rate, 94/95 contained/uncontained ECC, 119/120 GSP.
FATAL_XIDS = frozenset({48, 63, 64, 74, 79, 92, 94, 95, 119, 120})

ECC_COUNTERS = ("gpu_ecc_double_bit_total", "gpu_ecc_errors_total")
XID_COUNTER = "gpu_xid_errors_total"
XID_LAST = "gpu_xid_last"
TEMPERATURE = "gpu_temperature_celsius"
STEP_TIME = "step_time_seconds"


@dataclass(frozen=True)
class RuleConfig:
    temp_warn_c: float = 83.0
    """Temperature where risk starts (0.5), rising linearly to 1 at temp_critical_c."""
    temp_critical_c: float = 92.0
    """Temperature at which the GPU throttles hard or shuts down."""
    temp_lead_seconds: float = 30.0
    """A warm GPU whose recent trend reaches temp_critical_c within this long is at risk 0.85."""
    straggler_factor: float = 3.0
    """Median step time this many times the peers' median means risk 0.8."""
    straggler_steps: int = 5
    """Step times (latest) whose median stands for the node."""


@dataclass(frozen=True)
class Finding:
    kind: str  # "hardware" | "thermal" | "straggler"
    risk: float
    signal: str
    message: str
    lead_s: float | None = None
    """Seconds until the failure this finding expects (0: now); None: it predicts none."""


def hardware(window: NodeWindow) -> list[Finding]:
    """Uncorrectable ECC errors and fatal Xids seen within the window."""
    out = []
    for name in ECC_COUNTERS:
        grew = window.increase(name)
        if grew > 0:
            out.append(Finding("hardware", 1.0, name, f"{grew:g} uncorrectable ECC errors",
                               lead_s=0.0))  # fmt: skip
    if window.increase(XID_COUNTER) > 0:
        code = int(window.latest(XID_LAST) or 0)
        fatal = code in FATAL_XIDS or code == 0
        out.append(Finding("hardware", 1.0 if fatal else 0.6, XID_COUNTER,
                           f"Xid error (last code {code})", 0.0 if fatal else None))  # fmt: skip
    return out


def thermal(window: NodeWindow, cfg: RuleConfig) -> list[Finding]:
    t = window.latest(TEMPERATURE)
    if t is None or t < cfg.temp_warn_c:
        return []
    span = cfg.temp_critical_c - cfg.temp_warn_c
    risk = min(1.0, 0.5 + 0.5 * (t - cfg.temp_warn_c) / span)
    slope = window.slope(TEMPERATURE)  # degrees per second
    if slope > 0 and t + slope * cfg.temp_lead_seconds >= cfg.temp_critical_c:
        risk = max(risk, 0.85)
    return [Finding("thermal", risk, TEMPERATURE, f"GPU at {t:.1f} C, rising {slope:.2f} C/s",
                    thermal_lead(t, slope, cfg))]  # fmt: skip


def thermal_lead(t: float, slope: float, cfg: RuleConfig) -> float | None:
    """Seconds until the recent trend reaches the critical temperature: 0 once there,
    None while the temperature is not rising (a steady warm GPU predicts no time)."""
    if t >= cfg.temp_critical_c:
        return 0.0
    if slope <= 0:
        return None
    return (cfg.temp_critical_c - t) / slope


def straggler(window: NodeWindow, peers: Sequence[NodeWindow], cfg: RuleConfig) -> list[Finding]:
    """The fastest of the node's latest ``straggler_steps`` sampled steps against the
    median of its peers' medians over the same stretch of steps.

    A straggler is slow on every step, so its fastest recent step is the one compared:
    telemetry samples a few steps a second, and a node whose few samples happened to
    land on steps that were slow for everyone (a synchronous job's slots all wait for
    its slowest one) is not one. Over the same stretch of steps, not the peers' own
    latest: a standby promoted a moment ago has only fast steps behind it. A peer with
    fewer than half as many readings in that stretch is not compared; the node is not
    judged before it has ``straggler_steps`` steps (a first step pays start-up costs)."""
    mine = window.by_step(STEP_TIME)
    steps = sorted(mine)[-cfg.straggler_steps :]
    if len(steps) < cfg.straggler_steps:
        return []
    lo, hi = steps[0], steps[-1]
    others = []
    for peer in peers:
        theirs = [v for step, v in peer.by_step(STEP_TIME).items() if lo <= step <= hi]
        if len(theirs) * 2 >= cfg.straggler_steps and statistics.median(theirs) > 0:
            others.append(statistics.median(theirs))
    if not others:
        return []
    ratio = min(mine[k] for k in steps) / statistics.median(others)
    if ratio <= 1.0:
        return []
    risk = min(1.0, 0.8 * (ratio - 1.0) / (cfg.straggler_factor - 1.0))
    if risk < 0.05:
        return []
    return [Finding("straggler", risk, STEP_TIME, f"steps {ratio:.1f}x slower than peers")]
