"""Online anomaly scoring: an offline detector fitted on the fleet's own early telemetry.

There are no labels in a live cluster, so the detector learns what "normal" looks
like from the first ``fit_samples`` samples of every node together (nodes of one
fleet run the same work, so peers are each other's reference). Gauges only:
cumulative ``*_total`` counters grow forever and would look anomalous by age
alone (the hardware rules read them instead).

One code path with the offline evaluation: the detector is an instance of
``detectors.ALL[name]`` and is fitted by the same ``Detector.fit`` — ``RobustScaler``
on the first 80% of the samples (robust centre, floored spread, clipped; gauges
constant while fitting left out), the model on the same part, the last 20% (the most
recent samples) held out. A sample's anomaly score is the share of those held-out
scores below its own, so 0.99 means "stranger than 99% of recent normal telemetry":
the held-out quantiles the offline thresholds are taken from. Only point-wise
detectors (``POINTWISE``) serve online: the pooled samples of many nodes are not one
time series, which the forecaster and the autoencoder's windows need.

A point-wise detector cannot tell how far beyond the training range a point lies
(every tree of a forest puts it in the leaf at the edge), so a point more than
``far_z`` robust spreads out on any gauge (unclipped) scores 1.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence

import numpy as np


def gauge_names(samples: Sequence[Mapping[str, float]], share: float = 0.9) -> list[str]:
    """Metrics present in at least ``share`` of the samples, counters left out."""
    counts: dict[str, int] = {}
    for metrics in samples:
        for name in metrics:
            if not name.endswith("_total"):
                counts[name] = counts.get(name, 0) + 1
    need = share * len(samples)
    return sorted(n for n, c in counts.items() if c >= need)


POINTWISE = ("isolation_forest", "pca", "threshold_rule")
DEFAULT_DETECTOR = "isolation_forest"


class FleetForest:
    """The fleet's detector (an Isolation Forest by default; the name stays from then)."""

    def __init__(self, fit_samples: int = 200, seed: int = 0, far_z: float = 6.0,
                 detector: str = DEFAULT_DETECTOR):  # fmt: skip
        if detector not in POINTWISE:
            raise ValueError(f"online detector must be one of {', '.join(POINTWISE)}")
        self.fit_samples = fit_samples
        self.far_z = far_z
        self.seed = seed
        self.detector_name = detector
        self.pending: list[Mapping[str, float]] = []
        # The fleet's latest samples once fitted: what a refit learns from.
        self.recent: deque[Mapping[str, float]] = deque(maxlen=fit_samples)
        self.features: list[str] = []
        self.detector = None  # a detectors.Detector once fitted
        self.fits = 0

    @property
    def fitted(self) -> bool:
        return self.detector is not None

    def collect(self, metrics: Mapping[str, float]) -> bool:
        """Keep a sample for fitting; True once enough are held (call :meth:`fit`).
        Once fitted, samples go to ``recent``, the window a refit learns from."""
        if self.fitted:
            self.recent.append(dict(metrics))
            return False
        self.pending.append(dict(metrics))
        return len(self.pending) >= self.fit_samples

    def fit(self, samples: Sequence[Mapping[str, float]] | None = None) -> None:
        """Fit on ``samples`` (a refit: a snapshot of ``recent``), else on ``pending``.
        The new detector replaces the old one in one assignment, so a score taken
        while a refit runs in another thread reads one whole model or the other."""
        rows = list(self.pending if samples is None else samples)
        features = gauge_names(rows)
        if not features:
            self.pending.clear()  # nothing usable yet: start collecting again
            return
        x = self._matrix(rows, features, fill=None)
        # Imported here: scikit-learn takes seconds to import, and the service
        # should answer before the fleet has sent enough samples to fit on.
        from services.health import detectors

        detector = detectors.ALL[self.detector_name](seed=self.seed).fit(x)
        # one tuple: features, detector, sorted held-out scores (see ``score``)
        self._model = (features, detector, np.sort(detector.tail_scores))
        self.features, self.detector = features, detector
        self.fits += 1
        self.pending.clear()

    @property
    def scaler(self):
        return self.detector.scaler

    @property
    def held_out(self) -> np.ndarray:
        return self._model[2]

    def score(self, metrics: Mapping[str, float]) -> tuple[float, list[str]]:
        """(anomaly in [0, 1], the features furthest from normal, furthest first)."""
        if self.detector is None:
            return 0.0, []
        features, detector, held_out = self._model
        # a missing reading takes the training centre
        x = self._matrix([metrics], features, fill=detector.scaler.centre)
        raw = float(detector.score(x)[0])
        z = detector.scaler.z(x)
        anomaly = float(np.searchsorted(held_out, raw, side="left")) / len(held_out)
        if np.abs(z[0]).max() >= self.far_z:
            anomaly = 1.0
        order = np.argsort(-np.abs(z[0]))
        top = [features[i] for i in order[:3] if abs(z[0][i]) >= 3.0]
        return anomaly, top

    @staticmethod
    def _matrix(rows, features, fill) -> np.ndarray:
        x = np.empty((len(rows), len(features)), dtype=np.float64)
        for i, metrics in enumerate(rows):
            for j, name in enumerate(features):
                if name in metrics:
                    x[i, j] = metrics[name]
                elif fill is not None:
                    x[i, j] = fill[j]
                else:
                    x[i, j] = np.nan
        if fill is None:  # fitting: a missing reading takes its column's median
            med = np.nanmedian(x, axis=0)
            rows_nan, cols_nan = np.where(np.isnan(x))
            x[rows_nan, cols_nan] = np.nan_to_num(med[cols_nan])
        return x
