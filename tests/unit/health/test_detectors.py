"""Detectors on small real slices, fixed seeds.

SMD slice: machine-1-7, the last 5,000 training rows and the first 5,000 test rows, which
hold two labelled anomalies (rows 837-857 and 2959-4173). ASD: all of server omi-4
(8,640 training rows, 4,320 test rows, five labelled anomalies)."""

import numpy as np
import pytest

from services.health import datasets, detectors, metrics

from .conftest import load_or_skip


@pytest.fixture(scope="module")
def smd_slice():
    ds = load_or_skip(datasets.load_smd, ["machine-1-7"])
    (m,) = ds.machines
    return m.train[-5000:], m.test[:5000], m.labels[:5000]


def _run(name, smd_slice, **kw):
    train, test, y = smd_slice
    det = detectors.ALL[name](seed=0, **kw).fit(train)
    pred = det.predict(test)
    return det, {
        "point": metrics.prf(y, pred),
        "pa": metrics.prf_point_adjusted(y, pred),
        "event": metrics.event_recall_delay(y, pred),
    }


@pytest.mark.parametrize(
    "name, f1, pa_f1",
    [
        ("threshold_rule", 0.983, 0.985),
        ("pca", 0.975, 0.977),
        ("isolation_forest", 0.036, 0.988),
        ("ensemble", 0.986, 0.988),
    ],
)
def test_classical_detectors_measured_values(smd_slice, name, f1, pa_f1):
    _, r = _run(name, smd_slice)
    assert r["point"]["f1"] == pytest.approx(f1, abs=0.01)
    assert r["pa"]["f1"] == pytest.approx(pa_f1, abs=0.01)
    assert r["event"]["event_recall"] == 1.0


def test_autoencoder_finds_both_anomalies(smd_slice):
    _, r = _run("autoencoder", smd_slice, epochs=3)
    assert r["event"]["event_recall"] == 1.0
    assert r["pa"]["f1"] > 0.9
    assert r["point"]["precision"] > 0.2


def test_forecast_measured_values(smd_slice):
    _, r = _run("forecast", smd_slice)
    # It flags the onset of the long anomaly and then follows it (the scaled metrics sit
    # at their clip): PA-F1 high, point-wise F1 low.
    assert r["point"]["f1"] == pytest.approx(0.058, abs=0.01)
    assert r["pa"]["f1"] == pytest.approx(0.995, abs=0.01)
    assert r["event"]["event_recall"] == 1.0
    assert r["event"]["mean_delay"] <= 2


def test_forecast_autoencoder_measured_values(smd_slice):
    _, r = _run("forecast_ae", smd_slice, epochs=3)
    assert r["point"]["f1"] == pytest.approx(0.989, abs=0.01)
    assert r["pa"]["f1"] == pytest.approx(0.992, abs=0.01)
    assert r["event"]["event_recall"] == 1.0


@pytest.fixture(scope="module")
def omi4():
    (m,) = load_or_skip(datasets.load_asd, ["omi-4"]).machines
    return m.train, m.test, m.labels


@pytest.mark.parametrize(
    "name, f1, pa_f1, event_recall",
    [
        ("pca", 0.121, 0.493, 0.2),
        ("forecast", 0.335, 0.944, 1.0),
        ("forecast_ae", 0.373, 0.941, 1.0),
        ("ensemble", 0.341, 0.941, 1.0),
    ],
)
def test_asd_server_measured_values(omi4, name, f1, pa_f1, event_recall):
    _, r = _run(name, omi4)
    assert r["point"]["f1"] == pytest.approx(f1, abs=0.01)
    assert r["pa"]["f1"] == pytest.approx(pa_f1, abs=0.01)
    assert r["event"]["event_recall"] == event_recall


def _ar_series(n, rng, phi=0.8):
    x = np.zeros((n, 2))
    for t in range(1, n):
        x[t] = phi * x[t - 1] + rng.normal(0, 0.1, 2)
    return x


def test_forecast_learns_the_dynamics_and_flags_the_onset_of_a_shift():
    rng = np.random.default_rng(0)
    train = _ar_series(3000, rng)
    det = detectors.Forecast(window=3, seed=0).fit(train)
    # The most recent point carries the AR coefficient; older ones next to nothing.
    coef = det.coef.reshape(3, 2, 2)  # (lag position, input metric, output metric)
    assert np.diag(coef[-1]) == pytest.approx([0.8, 0.8], abs=0.05)
    assert np.abs(coef[:-1]).max() < 0.05
    # Scaled errors have mean 1 per metric on the series the model was fitted on.
    fit_part = det.scaler.transform(train[:2400])
    assert det.feature_errors(fit_part).mean(axis=0) == pytest.approx([1, 1], abs=0.05)
    test = _ar_series(400, rng)
    test[200:, 0] += 1.0  # a level shift of 10 noise units from row 200 on
    s = det.score(test)
    assert s[200] > 5 * det.threshold
    assert np.argmax(s) == 200
    # Once the new level is in the window the forecast follows it: far below the onset.
    assert np.median(s[230:]) < s[200] / 10


def test_forecast_floors_a_metric_that_never_moved():
    rng = np.random.default_rng(1)
    train = np.column_stack([_ar_series(1000, rng)[:, 0], np.zeros(1000)])
    det = detectors.Forecast(window=2, seed=0).fit(train)
    # The constant metric is flagged by the scaler and left out of the model's inputs.
    assert det.scaler.constant.tolist() == [False, True]
    assert det.coef.shape == (2, 1)
    assert np.isfinite(det.score(train + 0.01)).all()


def test_forecast_autoencoder_is_the_mean_of_two_standardised_parts(smd_slice):
    train, test, _ = smd_slice
    det = detectors.ForecastAutoencoder(seed=0, epochs=2).fit(train)
    fit_part = det.scaler.transform(train[: int(len(train) * 0.8)])
    # Each part is centred on its median over the training series it was fitted on.
    for s, (med, iqr) in zip(det._parts(fit_part), det.scales, strict=True):
        assert np.median((s - med) / iqr) == pytest.approx(0, abs=1e-9)
    z = det.scaler.transform(test[:500])
    parts = det._parts(z)
    expected = np.mean([(p - m) / q for p, (m, q) in zip(parts, det.scales, strict=True)], 0)
    assert det.score(test[:500]) == pytest.approx(expected)
    # Its autoencoder is the same model as the standalone detector with the same seed,
    # on the same scaled inputs.
    ae = detectors.Autoencoder(seed=0, epochs=2).fit(train)
    assert np.array_equal(det.ae.score(z), ae.score(test[:500]))


def test_threshold_comes_from_held_out_training_scores(smd_slice):
    train, _, _ = smd_slice
    det = detectors.PCAReconstruction(seed=0).fit(train)
    held_out = train[int(len(train) * 0.8) :]
    assert det.threshold == pytest.approx(np.quantile(det.score(held_out), 0.99))


def test_sliding_windows_pad_with_first_row():
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    w = detectors.sliding(x, 2)
    assert w.tolist() == [[0, 1, 0, 1], [0, 1, 2, 3], [2, 3, 4, 5]]
