"""Detectors on a small real slice of SMD (machine-1-7), fixed seeds.

The slice: the last 5,000 training rows and the first 5,000 test rows, which hold two
labelled anomalies (rows 837-857 and 2959-4173)."""

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
        ("threshold_rule", 0.843, 0.844),
        ("pca", 0.430, 0.791),
        ("isolation_forest", 0.047, 0.978),
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


def test_threshold_comes_from_held_out_training_scores(smd_slice):
    train, _, _ = smd_slice
    det = detectors.PCAReconstruction(seed=0).fit(train)
    held_out = train[int(len(train) * 0.8):]
    assert det.threshold == pytest.approx(np.quantile(det.score(held_out), 0.99))


def test_sliding_windows_pad_with_first_row():
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    w = detectors.sliding(x, 2)
    assert w.tolist() == [[0, 1, 0, 1], [0, 1, 2, 3], [2, 3, 4, 5]]
