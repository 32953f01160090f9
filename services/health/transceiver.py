"""Synthetic DDM telemetry of 400G optical transceivers, healthy and failing.

No public data set holds transceiver telemetry up to failure, so this generator writes one.
It is a model, not a measurement: the ranges follow what 400GBASE-DR4/FR4 QSFP-DD and OSFP
modules report through CMIS digital diagnostics, and the failure modes follow the usual
field-failure stories (connector contamination and fibre damage, laser wear-out, thermal
problems, marginal links that burst FEC errors, and modules that just die). docs/health.md
lists every range. Everything is drawn from one seeded numpy Generator: the same seed gives
the same modules, bit for bit.

Per module, every STEP_H hours over SPAN_H hours, channels are (see CHANNELS):
  tx_dbm_<lane>, rx_dbm_<lane> (4 lanes), bias_ma_<lane>, temp_c, vcc_v,
  fec_corrected, fec_uncorrected (cumulative counters, as modules report them),
  link_flaps (cumulative). A missed poll is a row of NaN.
A failing module's series ends at its last poll before failure_time.

Ground truth per failing module: ``warning`` is when its precursor begins (the ramp's
onset, drawn per mode), ``visible_warning`` is when the precursor first shows in the
signals, measured against the same module without the failure (see ``VISIBLE``). A ramp
that starts slowly, or bursts that stay rare, can begin hours before they show.
"""

from __future__ import annotations

import copy

import numpy as np

from services.health.datasets import Entity, PredictionSet

STEP_H = 0.25  # poll interval: 15 minutes
SPAN_H = 72.0  # hours observed per module
HORIZON_H = 24.0  # predict "fails within 24 h"
LANES = 4
CHANNELS = (
    [f"tx_dbm_{i}" for i in range(LANES)]
    + [f"rx_dbm_{i}" for i in range(LANES)]
    + [f"bias_ma_{i}" for i in range(LANES)]
    + ["temp_c", "vcc_v", "fec_corrected", "fec_uncorrected", "link_flaps"]
)
# Cumulative counters, and the channels that are one quantity on the four lanes.
NOTES = {
    "counters": ["fec_corrected", "fec_uncorrected", "link_flaps"],
    "lanes": [[f"{q}_{i}" for i in range(LANES)] for q in ("tx_dbm", "rx_dbm", "bias_ma")],
}
FAILURE_MODES = ("rx_decay", "bias_climb", "thermal_runaway", "fec_burst", "sudden_death")
ALARMING_KINDS = ("low_rx", "hot", "noisy_fec", "bias_step", "flap", "slow_drift")
# Hours before failure that the precursor begins, per mode (it shows later: see VISIBLE).
WARNING_H = {
    "rx_decay": (6.0, 24.0),
    "bias_climb": (8.0, 24.0),
    "thermal_runaway": (1.5, 8.0),
    "fec_burst": (3.0, 20.0),
    "sudden_death": (0.0, 0.25),
}
# When a precursor shows: the failing module is compared with the same module without the
# failure (noise-free, physical units). A gauge shows it once it departs by three times
# its sensor noise (dB, mA, degC, V). FEC corrections show it once the polls with at least
# twice the link's usual rate come more densely, over some span of up to VISIBLE_SPAN
# polls, than they ever do on that span without the failure: a burst like the ones the
# link has anyway says nothing. Uncorrectable codewords show it from one per poll, link
# flaps from a 10% chance per poll.
VISIBLE = {"tx": 0.15, "rx": 0.3, "bias": 0.9, "temp": 0.9, "vcc": 0.03}
VISIBLE_FEC_RATIO = 2.0
VISIBLE_SPAN = 24
VISIBLE_UNC = 1.0
VISIBLE_FLAP = 0.1


class _Module:
    """Physical state of one module over time, in physical units, before noise."""

    def __init__(self, rng: np.random.Generator, n: int, t: np.ndarray):
        self.rng, self.n, self.t = rng, n, t
        diurnal = np.sin(2 * np.pi * (t / 24.0) + rng.uniform(0, 2 * np.pi))
        self.tx = np.tile(rng.uniform(-1.0, 2.0, LANES), (n, 1))
        self.rx = np.tile(rng.uniform(-5.0, -0.5, LANES), (n, 1))
        self.bias = np.tile(rng.uniform(35.0, 55.0, LANES), (n, 1))
        # Module temperature follows the hall's daily load cycle by a couple of degrees.
        self.temp = rng.uniform(35.0, 55.0) + rng.uniform(0.5, 2.5) * diurnal
        self.vcc = np.full(n, rng.uniform(3.27, 3.33))
        # Pre-FEC errors are normal on PAM4 links: a healthy link corrects a steady
        # trickle of codewords, its level set by the link's margin.
        self.fec_rate = np.full(n, 10 ** rng.uniform(2.5, 4.5))
        self.unc_rate = np.zeros(n)
        self.flap_p = np.zeros(n)

    def couple(self):
        """Effects every mode shares: bias and tx follow temperature (APC loop, laser
        efficiency), and FEC errors grow as the weakest lane's received power falls."""
        dt = np.maximum(self.temp - 50.0, 0.0)
        self.bias += 0.3 * dt[:, None]
        self.tx -= 0.02 * dt[:, None]
        margin = -7.0 - self.rx.min(axis=1)  # dB below the comfortable receive level
        self.fec_rate *= 10 ** (0.8 * np.clip(margin, 0, None))
        self.unc_rate += 10 ** np.clip(1.2 * (-10.0 - self.rx.min(axis=1)), -9, 6) - 1e-9
        self.flap_p += np.where(self.rx.min(axis=1) < -11.5, 0.15, 0.0)


def _ramp(t, start, end, power):
    """0 before start, rising to 1 at end as ((t-start)/(end-start))**power."""
    u = np.clip((t - start) / max(end - start, 1e-9), 0.0, 1.0)
    return u**power


def _failure(m: _Module, mode: str, f: float, warn: float, quiet: _Module):
    """Apply the failure's precursor to ``m``. ``quiet`` is the same module without the
    failure; it keeps what would have happened anyway (the link's usual bursts)."""
    rng, t = m.rng, m.t
    lane = rng.integers(LANES)
    u = _ramp(t, f - warn, f, rng.uniform(1.0, 2.5))
    if mode == "rx_decay":  # fibre or connector degrading until loss of signal
        m.rx[:, lane] -= (m.rx[0, lane] + rng.uniform(12.5, 14.0)) * u
    elif mode == "bias_climb":  # laser wear-out: APC raises bias until it runs out
        m.bias[:, lane] += (rng.uniform(85, 95) - m.bias[0, lane]) * u
        m.tx[:, lane] -= 4.0 * np.clip((u - 0.85) / 0.15, 0, 1)
        m.temp += 2.0 * u
    elif mode == "thermal_runaway":  # failing TEC or fan: temperature accelerates
        a = rng.uniform(2.0, 4.0)
        v = (np.exp(a * u) - 1) / (np.exp(a) - 1)
        m.temp += (rng.uniform(85, 92) - m.temp[0]) * v
        m.vcc -= 0.06 * v
    elif mode == "fec_burst":  # marginal link: bursts of errors, more and more often
        draw = rng.random(m.n)
        size = 10 ** rng.uniform(1.5, 3.0, m.n)
        bursts = draw < 0.01 + 0.6 * u**2
        m.fec_rate *= np.where(bursts, size, 1.0)
        # A marginal link bursts on 1% of polls anyway: those are no precursor.
        quiet.fec_rate *= np.where(draw < 0.01, size, 1.0)
        m.unc_rate += np.where(bursts & (u > 0.5), 300.0 * u**3, 0.0)
        m.flap_p += np.where(u > 0.85, 0.1, 0.0)
    # sudden_death: nothing changes before the failure.


def _denser_fec(m: _Module, quiet: _Module) -> np.ndarray:
    """Per poll: over some span of up to VISIBLE_SPAN polls ending there, the failing link
    had more polls of high FEC than the quiet link has in any span that long."""
    high = VISIBLE_FEC_RATIO * np.median(quiet.fec_rate)
    fail = np.concatenate(([0], np.cumsum(m.fec_rate >= high)))
    calm = np.concatenate(([0], np.cumsum(quiet.fec_rate >= high)))
    seen = np.zeros(m.n, dtype=bool)
    for span in range(1, VISIBLE_SPAN + 1):
        seen[span - 1 :] |= fail[span:] - fail[:-span] > (calm[span:] - calm[:-span]).max()
    return seen


def _visible_from(m: _Module, quiet: _Module) -> int | None:
    """First poll where the failing module departs visibly from ``quiet`` (both coupled),
    or None when it never does (a sudden death)."""
    seen = np.zeros(m.n, dtype=bool)
    for name, level in VISIBLE.items():
        d = np.abs(getattr(m, name) - getattr(quiet, name))
        seen |= (d.max(axis=1) if d.ndim > 1 else d) >= level
    seen |= _denser_fec(m, quiet)
    seen |= m.unc_rate - quiet.unc_rate >= VISIBLE_UNC
    seen |= m.flap_p - quiet.flap_p >= VISIBLE_FLAP
    hits = np.flatnonzero(seen)
    return int(hits[0]) if hits.size else None


def _alarming(m: _Module, kind: str, span: float):
    """Healthy modules that cross alarm levels or look odd, and keep working."""
    rng, t = m.rng, m.t
    lane = rng.integers(LANES)
    if kind == "low_rx":  # dirty connector: low but stable receive power
        m.rx[:, lane] = rng.uniform(-10.5, -8.5)
    elif kind == "hot":  # badly cooled slot, stable
        m.temp += rng.uniform(62.0, 72.0) - m.temp.mean()
    elif kind == "noisy_fec":  # steady bursts that never escalate
        bursts = rng.random(m.n) < rng.uniform(0.05, 0.25)
        m.fec_rate *= np.where(bursts, 10 ** rng.uniform(1.0, 2.5, m.n), 1.0)
    elif kind == "bias_step":  # APC recalibration after a firmware update
        m.bias[:, lane] += rng.uniform(10.0, 20.0) * (t > t[0] + rng.uniform(0, span))
    elif kind == "flap":  # cable reseated once or twice
        m.flap_p[rng.integers(0, m.n, rng.integers(1, 4))] = 1.0
    elif kind == "slow_drift":  # ageing, slower than anything that fails here
        m.rx[:, lane] -= rng.uniform(1.0, 2.0) * (t - t[0]) / span


def _observe(m: _Module, rng: np.random.Generator) -> np.ndarray:
    """Add sensor noise, integrate counters, and drop missed polls."""
    n = m.n
    tx = m.tx + rng.normal(0, 0.05, m.tx.shape)
    rx = m.rx + rng.normal(0, 0.1, m.rx.shape)
    bias = m.bias + rng.normal(0, 0.3, m.bias.shape)
    temp = m.temp + rng.normal(0, 0.3, n)
    vcc = m.vcc + rng.normal(0, 0.01, n)
    fec = np.cumsum(rng.poisson(np.clip(m.fec_rate, 0, 1e9)))
    unc = np.cumsum(rng.poisson(np.clip(m.unc_rate, 0, 1e6)))
    flaps = np.cumsum(rng.random(n) < np.clip(m.flap_p, 0, 1))
    x = np.column_stack([tx, rx, bias, temp, vcc, fec, unc, flaps]).astype(np.float64)
    missing = rng.random(n) < 0.02  # isolated missed polls
    for _ in range(rng.poisson(1.0)):  # and a gap or two of up to 2 hours
        s = rng.integers(0, n)
        missing[s : s + rng.integers(1, 9)] = True
    missing[0] = False  # the first poll anchors the counters
    x[missing] = np.nan
    return x.astype(np.float32)


def _one(rng: np.random.Generator, name: str, kind: str) -> Entity:
    n = int(round(SPAN_H / STEP_H))
    start = rng.uniform(0, 24.0 * 30)  # any time of day, any day of the month
    failing = kind in FAILURE_MODES
    if failing:
        # Failure strikes between one and two polls after the last observed one.
        f = start + SPAN_H + rng.uniform(0.0, STEP_H)
        t = f - STEP_H * np.arange(n, 0, -1) - rng.uniform(0, 1e-3)
        warn = rng.uniform(*WARNING_H[kind])
    else:
        t = start + STEP_H * np.arange(n)
        f, warn = float("nan"), float("nan")
    m = _Module(rng, n, t)
    visible = float("nan")
    if failing:
        quiet = copy.copy(m)
        for k in ("tx", "rx", "bias", "temp", "vcc", "fec_rate", "unc_rate", "flap_p"):
            setattr(quiet, k, getattr(m, k).copy())
        _failure(m, kind, f, warn, quiet)
        m.couple()
        quiet.couple()
        first = _visible_from(m, quiet)
        visible = 0.0 if first is None else float(f - t[first])
    else:
        if kind != "healthy":
            _alarming(m, kind, SPAN_H)
        m.couple()
    return Entity(name, t, _observe(m, rng), float(f), kind, float(warn), visible)


def generate(
    n: int,
    seed: int,
    failing_fraction: float = 0.4,
    alarming_fraction: float = 0.35,
    prefix: str = "xcvr",
) -> list[Entity]:
    """``n`` modules: ``failing_fraction`` fail (modes in equal shares), and of the rest
    ``alarming_fraction`` look alarming without failing. Deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    n_fail = int(round(n * failing_fraction))
    n_alarm = int(round((n - n_fail) * alarming_fraction))
    kinds = [FAILURE_MODES[i % len(FAILURE_MODES)] for i in range(n_fail)]
    kinds += [ALARMING_KINDS[i % len(ALARMING_KINDS)] for i in range(n_alarm)]
    kinds += ["healthy"] * (n - len(kinds))
    order = rng.permutation(len(kinds))
    return [_one(rng, f"{prefix}-{i:04d}", kinds[k]) for i, k in enumerate(order)]


def load_transceiver(seed: int = 0, n_train: int = 500, n_test: int = 300) -> PredictionSet:
    """Train and test populations drawn independently (seeds derived from ``seed``)."""
    return PredictionSet(
        name="transceiver",
        channels=list(CHANNELS),
        train=generate(n_train, seed * 2 + 1, prefix="train"),
        test=generate(n_test, seed * 2 + 2, prefix="test"),
        horizon=HORIZON_H,
        time_unit="hours",
        step=STEP_H,
        notes=dict(NOTES),
    )
