"""Unsupervised anomaly detectors with one contract: ``fit(train)`` then ``score(x)``.

Every detector learns from unlabelled training data only. ``fit`` holds out the last
``val_fraction`` of the training series (the most recent part, as a deployment would) and
sets ``threshold`` to the ``quantile`` of the scores on that held-out part, so no test
label ever touches a threshold. A higher score means more anomalous.

``fit`` first scales the metrics with ``scaling.RobustScaler`` fitted on the same first
part (robust centre and floored spread, clipped, constant metrics dropped), so no metric
can blow a score up; ``score`` applies the same scaling. ``fit_model`` takes inputs that
are already standardised (the failure predictor's window summaries) and scales nothing.
"""

from __future__ import annotations

import numpy as np
from sklearn.decomposition import PCA
from sklearn.ensemble import IsolationForest

from services.health.scaling import RobustScaler

# torch is imported by the autoencoder only, when it is used: the health service fits
# point-wise detectors online and should not carry torch (seconds, hundreds of MB).


class Detector:
    name = "detector"

    def __init__(self, quantile: float = 0.99, val_fraction: float = 0.2, seed: int = 0):
        self.quantile = quantile
        self.val_fraction = val_fraction
        self.seed = seed
        self.threshold = float("inf")
        self.scaler: RobustScaler | None = None
        self.tail_scores = np.zeros(0)

    def fit(self, train: np.ndarray) -> Detector:
        train = np.asarray(train, dtype=np.float32)
        cut = int(len(train) * (1 - self.val_fraction))
        self.scaler = RobustScaler().fit(train[:cut])
        self._fit(self.scaler.transform(train[:cut]))
        # Kept so a caller can try other quantiles without refitting (machine-level
        # tuning in eval_detection); the threshold itself is set here, once.
        self.tail_scores = self.score(train[cut:])
        self.threshold = float(np.quantile(self.tail_scores, self.quantile))
        return self

    def fit_model(self, train: np.ndarray) -> Detector:
        """Fit on all of ``train`` and leave the threshold to the caller (the failure
        predictor picks it on validation entities)."""
        self._fit(np.asarray(train, dtype=np.float32))
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        return self.flags(self.score(x), self.threshold)

    def flags(self, scores: np.ndarray, threshold: float) -> np.ndarray:
        """A score flags when it reaches ``threshold``; when no held-out training score
        is below it (a detector with nothing to tell apart, every metric constant),
        reaching it is what every normal point does, so a score must exceed it."""
        if self.tail_scores.size and threshold <= self.tail_scores.min():
            return scores > threshold
        return scores >= threshold

    def _fit(self, x: np.ndarray) -> None:
        raise NotImplementedError

    def score(self, x: np.ndarray) -> np.ndarray:
        return self._score(x if self.scaler is None else self.scaler.transform(x))

    def _score(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class ThresholdRule(Detector):
    """What a static alarm does: flag a point when any metric leaves its usual range.
    Score = largest |z| over metrics, z against the training mean and spread."""

    name = "threshold_rule"

    def _fit(self, x):
        self.mu = x.mean(axis=0)
        # Metrics that never move in training get a floor, else any wiggle is infinite.
        self.sd = np.maximum(x.std(axis=0), 1e-3)

    def _score(self, x):
        return np.abs((np.asarray(x) - self.mu) / self.sd).max(axis=1)


class PCAReconstruction(Detector):
    """Baseline: squared error of reconstructing each point from the principal subspace
    that keeps ``variance`` of the training variance."""

    name = "pca"

    def __init__(self, variance: float = 0.9, **kw):
        super().__init__(**kw)
        self.variance = variance

    def _fit(self, x):
        # Training inputs without any variance (every metric constant) make
        # scikit-learn divide 0 by 0 for the explained-variance ratios; the fitted
        # subspace is still usable (it reconstructs the constant), so stay quiet.
        with np.errstate(invalid="ignore", divide="ignore"):
            self.pca = PCA(n_components=self.variance, svd_solver="full").fit(x)

    def _score(self, x):
        x = np.asarray(x, dtype=np.float64)
        rec = self.pca.inverse_transform(self.pca.transform(x))
        return ((x - rec) ** 2).sum(axis=1)


class IForest(Detector):
    """Isolation Forest on single points (scikit-learn). score_samples is higher for
    normal points, so the anomaly score is its negation."""

    name = "isolation_forest"

    def __init__(self, n_estimators: int = 100, **kw):
        super().__init__(**kw)
        self.n_estimators = n_estimators

    def _fit(self, x):
        self.model = IsolationForest(
            n_estimators=self.n_estimators, random_state=self.seed, n_jobs=1
        ).fit(x)

    def _score(self, x):
        return -self.model.score_samples(np.asarray(x, dtype=np.float32))


def sliding(x: np.ndarray, window: int) -> np.ndarray:
    """(n, d) -> (n, window*d): row i holds points i-window+1..i, the first row repeated
    before the start so every point gets a score."""
    pad = np.repeat(x[:1], window - 1, axis=0)
    xp = np.concatenate([pad, x], axis=0)
    idx = np.arange(len(x))[:, None] + np.arange(window)[None, :]
    return xp[idx].reshape(len(x), -1)


# Smallest residual variance a metric is given (a standard deviation of 1e-3, the floor
# ThresholdRule uses), so a metric that never moves in training cannot divide by zero.
_VAR_FLOOR = 1e-6


def _robust_scale(s: np.ndarray) -> tuple[float, float]:
    """Median and interquartile range of scores, for putting detectors on one scale."""
    q1, med, q3 = np.quantile(s, [0.25, 0.5, 0.75])
    return float(med), float(max(q3 - q1, 1e-12))


class Forecast(Detector):
    """Linear autoregressive forecaster: each point is predicted from the ``window`` points
    before it by ridge regression (one closed-form solve, no randomness).

    A metric's squared forecast error is divided by its mean on the training series, so
    every metric is measured in units of how predictable it was in training; the score is
    the mean over metrics. A forecaster sees the onset of a change (a jump, a break in
    how metrics move together) and then adapts to a new level, where a reconstruction
    model keeps flagging a level it never saw."""

    name = "forecast"

    def __init__(self, window: int = 10, ridge: float = 1.0, **kw):
        super().__init__(**kw)
        self.window, self.ridge = window, ridge

    def _lagged(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        w = sliding(np.asarray(x, dtype=np.float64), self.window + 1)
        d = w.shape[1] // (self.window + 1)
        return w[:, :-d], w[:, -d:]

    def _fit(self, x):
        past, now = self._lagged(x)
        self.past_mean, self.now_mean = past.mean(axis=0), now.mean(axis=0)
        pc = past - self.past_mean
        gram = pc.T @ pc + self.ridge * np.eye(pc.shape[1])
        self.coef = np.linalg.solve(gram, pc.T @ (now - self.now_mean))
        self.scale = np.maximum(self._squared_errors(x).mean(axis=0), _VAR_FLOOR)

    def _squared_errors(self, x: np.ndarray) -> np.ndarray:
        past, now = self._lagged(x)
        return (now - self.now_mean - (past - self.past_mean) @ self.coef) ** 2

    def feature_errors(self, x: np.ndarray) -> np.ndarray:
        """(n, d) squared forecast error per metric, in units of its training mean."""
        return self._squared_errors(x) / self.scale

    def _score(self, x):
        return self.feature_errors(x).mean(axis=1)


def _ae_net(n_in: int, hidden: int, code: int):
    from torch import nn

    return nn.Sequential(
        nn.Linear(n_in, hidden),
        nn.ReLU(),
        nn.Linear(hidden, code),
        nn.ReLU(),
        nn.Linear(code, hidden),
        nn.ReLU(),
        nn.Linear(hidden, n_in),
    )


class Autoencoder(Detector):
    """A small fully connected autoencoder over sliding windows (torch, CPU).

    Windows let it learn how metrics move together over a few steps, which single-point
    detectors cannot; the score of a point is the mean squared reconstruction error of
    the window ending at it."""

    name = "autoencoder"

    def __init__(
        self,
        window: int = 10,
        hidden: int = 128,
        code: int = 16,
        epochs: int = 15,
        lr: float = 1e-3,
        batch: int = 256,
        **kw,
    ):
        super().__init__(**kw)
        self.window, self.hidden, self.code = window, hidden, code
        self.epochs, self.lr, self.batch = epochs, lr, batch

    def _fit(self, x):
        import torch

        torch.manual_seed(self.seed)
        w = torch.from_numpy(sliding(x, self.window).astype(np.float32))
        self.model = _ae_net(w.shape[1], self.hidden, self.code)
        opt = torch.optim.Adam(self.model.parameters(), lr=self.lr)
        gen = torch.Generator().manual_seed(self.seed)
        self.model.train()
        for _ in range(self.epochs):
            for idx in torch.randperm(len(w), generator=gen).split(self.batch):
                loss = ((self.model(w[idx]) - w[idx]) ** 2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
        self.model.eval()

    def _score(self, x):
        import torch

        w = torch.from_numpy(sliding(np.asarray(x, np.float32), self.window))
        with torch.no_grad():
            return ((self.model(w) - w) ** 2).mean(dim=1).numpy().astype(np.float64)

    def feature_errors(self, x: np.ndarray) -> np.ndarray:
        """(n, d) squared reconstruction error per metric, averaged over the window."""
        import torch

        x = np.asarray(x, np.float32)
        w = torch.from_numpy(sliding(x, self.window))
        with torch.no_grad():
            err = ((self.model(w) - w) ** 2).numpy().astype(np.float64)
        return err.reshape(len(x), self.window, x.shape[1]).mean(axis=1)


class ForecastAutoencoder(Detector):
    """Forecasting and reconstruction together, as joint anomaly scores do in the
    literature (e.g. MTAD-GAT, Zhao et al., ICDM 2020).

    The forecaster flags the onset of a change; the windowed autoencoder keeps flagging a
    state that does not look like training for as long as it lasts. Each part's
    per-metric squared error is divided by its training mean (as in ``Forecast``), averaged
    over metrics, then put on a common scale by the median and interquartile range of that
    part's scores on the training series; the score is the mean of the two."""

    name = "forecast_ae"

    def __init__(self, window: int = 10, epochs: int = 15, **kw):
        super().__init__(**kw)
        self.window, self.epochs = window, epochs

    def _fit(self, x):
        self.forecast = Forecast(window=self.window, seed=self.seed)
        self.forecast._fit(x)
        self.ae = Autoencoder(window=self.window, epochs=self.epochs, seed=self.seed)
        self.ae._fit(x)
        self.ae_scale = np.maximum(self.ae.feature_errors(x).mean(axis=0), _VAR_FLOOR)
        self.scales = [_robust_scale(s) for s in self._parts(x)]

    def _parts(self, x) -> list[np.ndarray]:
        return [
            self.forecast.score(x),
            (self.ae.feature_errors(x) / self.ae_scale).mean(axis=1),
        ]

    def _score(self, x):
        parts = self._parts(x)
        return np.mean(
            [(s - med) / iqr for s, (med, iqr) in zip(parts, self.scales, strict=True)], axis=0
        )


class Ensemble(Detector):
    """One detector of each family, averaged: reconstruction (PCA), isolation (Isolation
    Forest) and forecasting (``Forecast``). Each member's score is put on a common scale
    by the median and interquartile range of its scores on the fitting data, then the
    three are averaged. Fixed before any test figure of it was seen; the autoencoder is
    left out because it costs more than the three others together."""

    name = "ensemble"

    def _fit(self, x):
        self.members = [
            PCAReconstruction(seed=self.seed),
            IForest(seed=self.seed),
            Forecast(seed=self.seed),
        ]
        for m in self.members:
            m._fit(x)
        self.scales = [_robust_scale(m.score(x)) for m in self.members]

    def _score(self, x):
        return np.mean(
            [
                (m.score(x) - med) / iqr
                for m, (med, iqr) in zip(self.members, self.scales, strict=True)
            ],
            axis=0,
        )


ALL = {
    "threshold_rule": ThresholdRule,
    "pca": PCAReconstruction,
    "isolation_forest": IForest,
    "autoencoder": Autoencoder,
    "forecast": Forecast,
    "forecast_ae": ForecastAutoencoder,
    "ensemble": Ensemble,
}
