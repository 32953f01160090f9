"""Per-metric scaling that cannot explode, shared by the offline detectors and the
online fleet forest.

A metric is centred on its training median and divided by a robust spread: the
interquartile range over 1.349 (the standard deviation, for a normal distribution),
floored. The floor is the larger of the metric's resolution (the usual step between
its distinct training values: one count, one hundredth of a percent) and 1% of its
training range. Without a floor, a metric that barely moved in training (spread 0.003)
turns an ordinary test wiggle into z = 100 and flags every point. Standardised values
are clipped at ``clip``, so one metric can add at most a bounded amount to any score.

Metrics constant in training carry nothing a detector can learn normal behaviour from,
and any change would be an infinite z: they are flagged (``constant``) and left out of
the detector's inputs (``transform`` drops them). For reports (``z``) their spread is
0.1% of their value, so a gauge that never moved and then does shows as far out.
"""

from __future__ import annotations

import numpy as np

CLIP = 10.0  # |z| cap: a metric at the cap counts as "far out", never as "infinitely far"
RANGE_FLOOR = 0.01  # spread >= 1% of the training range
IQR_TO_SD = 1.349  # IQR of a unit normal


def resolution(col: np.ndarray) -> float:
    """The usual step between distinct values of a column (0 if it has one value).
    The median gap, not the smallest: float rounding leaves a few tiny gaps."""
    u = np.unique(col[np.isfinite(col)])
    return float(np.median(np.diff(u))) if u.size > 1 else 0.0


class RobustScaler:
    def __init__(self, clip: float = CLIP, range_floor: float = RANGE_FLOOR):
        self.clip, self.range_floor = clip, range_floor

    def fit(self, x: np.ndarray) -> RobustScaler:
        x = np.asarray(x, dtype=np.float64)
        q1, med, q3 = np.nanquantile(x, [0.25, 0.5, 0.75], axis=0)
        span = np.nanmax(x, axis=0) - np.nanmin(x, axis=0)
        res = np.array([resolution(x[:, c]) for c in range(x.shape[1])])
        self.constant = ~(span > 0)  # NaN-only columns count as constant too
        # With nothing but constant metrics, keep them all (their inputs are then 0).
        self.keep = (
            np.flatnonzero(~self.constant) if not self.constant.all() else np.arange(x.shape[1])
        )
        floor = np.maximum(res, self.range_floor * np.nan_to_num(span))
        self.centre = np.nan_to_num(med)
        fixed = 1e-6 + 1e-3 * np.abs(self.centre)
        self.spread = np.where(self.constant, fixed, np.maximum((q3 - q1) / IQR_TO_SD, floor))
        return self

    def transform(self, x: np.ndarray) -> np.ndarray:
        """(n, d) -> (n, d kept) float32 within ±clip; a missing value is the centre."""
        x = np.asarray(x, dtype=np.float64)[:, self.keep]
        z = (x - self.centre[self.keep]) / self.spread[self.keep]
        return np.clip(np.nan_to_num(z, nan=0.0), -self.clip, self.clip).astype(np.float32)

    def z(self, x: np.ndarray) -> np.ndarray:
        """Like ``transform`` but unclipped and for every metric (constant ones against
        their one value): how far out each metric is, for reports and far-out checks."""
        return (np.asarray(x, dtype=np.float64) - self.centre) / self.spread
