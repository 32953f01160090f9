"""Online anomaly scoring: an Isolation Forest fitted on the fleet's own early telemetry.

There are no labels in a live cluster, so the forest learns what "normal" looks
like from the first ``fit_samples`` samples of every node together (nodes of one
fleet run the same work, so peers are each other's reference). Gauges only:
cumulative ``*_total`` counters grow forever and would look anomalous by age
alone (the hardware rules read them instead). A sample's anomaly score is the
fraction of the training samples that look more normal than it (the empirical
CDF of the forest's score), so 0.99 means "stranger than 99% of what we saw".

Gauges are scaled by ``scaling.RobustScaler``, the offline detectors' scaling (robust
centre, floored spread, clipped; gauges constant while fitting left out of the forest).
A forest cannot tell how far beyond the training range a point lies: every tree
puts it in the leaf at the edge, beside the most extreme training points. So a
point more than ``far_z`` robust spreads out on any gauge (unclipped) scores 1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from services.health.scaling import RobustScaler


def gauge_names(samples: Sequence[Mapping[str, float]], share: float = 0.9) -> list[str]:
    """Metrics present in at least ``share`` of the samples, counters left out."""
    counts: dict[str, int] = {}
    for metrics in samples:
        for name in metrics:
            if not name.endswith("_total"):
                counts[name] = counts.get(name, 0) + 1
    need = share * len(samples)
    return sorted(n for n, c in counts.items() if c >= need)


class FleetForest:
    def __init__(self, fit_samples: int = 200, seed: int = 0, far_z: float = 6.0):
        self.fit_samples = fit_samples
        self.far_z = far_z
        self.seed = seed
        self.pending: list[Mapping[str, float]] = []
        self.features: list[str] = []
        self.detector = None  # sklearn IsolationForest once fitted

    @property
    def fitted(self) -> bool:
        return self.detector is not None

    def collect(self, metrics: Mapping[str, float]) -> bool:
        """Keep a sample for fitting; True once enough are held (call :meth:`fit`)."""
        if self.fitted:
            return False
        self.pending.append(dict(metrics))
        return len(self.pending) >= self.fit_samples

    def fit(self) -> None:
        features = gauge_names(self.pending)
        if not features:
            self.pending.clear()  # nothing usable yet: start collecting again
            return
        x = self._matrix(self.pending, features, fill=None)
        self.scaler = RobustScaler().fit(x)
        self.mean = self.scaler.centre  # a missing reading takes the training centre
        z = self.scaler.transform(x)
        # Imported here: scikit-learn takes seconds to import, and the service
        # should answer before the fleet has sent enough samples to fit on.
        from sklearn.ensemble import IsolationForest

        detector = IsolationForest(n_estimators=100, random_state=self.seed, n_jobs=1).fit(z)
        self.train_scores = np.sort(-detector.score_samples(z))
        self.features, self.detector = features, detector
        self.pending.clear()

    def score(self, metrics: Mapping[str, float]) -> tuple[float, list[str]]:
        """(anomaly in [0, 1], the features furthest from normal, furthest first)."""
        if self.detector is None:
            return 0.0, []
        x = self._matrix([metrics], self.features, fill=self.mean)
        raw = float(-self.detector.score_samples(self.scaler.transform(x))[0])
        z = self.scaler.z(x)
        anomaly = float(np.searchsorted(self.train_scores, raw, side="left")) / len(
            self.train_scores
        )
        if np.abs(z[0]).max() >= self.far_z:
            anomaly = 1.0
        order = np.argsort(-np.abs(z[0]))
        top = [self.features[i] for i in order[:3] if abs(z[0][i]) >= 3.0]
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
