"""What keeps a large fleet export's evaluation in bounded memory: float32 windows built
one entity at a time, raw rows dropped once cleaned, baselines scored a run at a time,
a count-only cap on the networks' training windows, and scores and summaries written
into one array instead of joined from per-batch pieces."""

import numpy as np
import pytest
import torch

from services.health import datasets, detectors, eval_prediction, fgl, transceiver
from services.health.datasets import PredictionSet
from services.health.windows import clean, make_windows


def _fleet(n_train=30, n_test=12):
    return PredictionSet(
        "transceiver",
        list(transceiver.CHANNELS),
        transceiver.generate(n_train, 21, prefix="a"),
        transceiver.generate(n_test, 22, prefix="b"),
        transceiver.HORIZON_H,
        "hours",
        transceiver.STEP_H,
        dict(transceiver.NOTES),
    )


def test_windows_take_their_rows_from_a_generator_one_entity_at_a_time():
    ents = [
        datasets.Entity(f"e{k}", np.arange(8.0 + k), np.full((8 + k, 2), k, np.float32))
        for k in range(3)
    ]
    pulled = []

    def one_at_a_time():
        for e in ents:
            pulled.append(e.name)
            yield clean(e, [])

    listed = make_windows(ents, [clean(e, []) for e in ents], 4, 3.0, 2)
    streamed = make_windows(ents, one_at_a_time(), 4, 3.0, 2)
    assert pulled == ["e0", "e1", "e2"]
    assert str(streamed.z.dtype) == "torch.float32"
    assert np.array_equal(streamed.z.numpy(), listed.z.numpy())
    # each entity padded in front with its first row: 3 extra rows each
    assert streamed.z.shape == (8 + 9 + 10 + 3 * 3, 3)
    assert np.array_equal(streamed.end, listed.end)
    assert streamed.batch(np.array([0])).numpy()[0, :, 0].tolist() == [0.0] * 4


def test_windows_refuse_rows_that_do_not_match_the_times():
    e = datasets.Entity("a", np.arange(5.0), np.zeros((5, 1), np.float32))
    with pytest.raises(ValueError, match="a: 4 cleaned rows for 5 times"):
        make_windows([e], [np.zeros((4, 2), np.float32)], 3, 1.0, 1)


def test_build_makes_float32_windows_and_can_drop_raw_rows():
    kept, dropped = _fleet(), _fleet()
    a = eval_prediction._build(kept, 0)
    b = eval_prediction._build(dropped, 0, release_raw=True)
    for (wa, _), (wb, _) in zip(a, b, strict=True):
        assert str(wa.z.dtype) == "torch.float32"
        assert np.array_equal(wa.z.numpy(), wb.z.numpy())  # dropping changes nothing
        assert np.array_equal(wa.y, wb.y) and np.array_equal(wa.t, wb.t)
    assert all(e.x.shape[0] > 0 for e in kept.train + kept.test)
    assert all(e.x.shape[0] == 0 for e in dropped.train + dropped.test)


def test_baselines_score_in_runs_exactly_as_at_once(monkeypatch):
    (fit, _), (val, _), _ = eval_prediction._build(_fleet(), 0)
    healthy = fit.summary(np.flatnonzero(fit.y == 0))
    for name in ("pca", "isolation_forest", "threshold_rule"):
        det = detectors.ALL[name](seed=0).fit_model(healthy)
        at_once = det.score(val.summary())
        in_runs = eval_prediction._score_parts(det, val)
        with monkeypatch.context() as m:  # runs of 97 windows, the last one shorter
            m.setattr(
                type(val),
                "parts",
                lambda self: (
                    np.arange(s, min(s + 97, len(self.end))) for s in range(0, len(self.end), 97)
                ),
            )
            in_small_runs = eval_prediction._score_parts(det, val)
        assert len(at_once) == len(val.end) > 97 * 3
        assert np.array_equal(in_runs, at_once)
        assert np.allclose(in_small_runs, at_once, rtol=0, atol=1e-9)


def test_training_windows_are_capped_by_count_alone():
    assert np.array_equal(eval_prediction.train_index(500, 3, cap=500), np.arange(500))
    idx = eval_prediction.train_index(10_000, 3, cap=1_000)
    assert len(idx) == 1_000 and len(np.unique(idx)) == 1_000
    assert (np.diff(idx) > 0).all() and idx.max() < 10_000
    assert np.array_equal(idx, eval_prediction.train_index(10_000, 3, cap=1_000))  # seeded
    assert not np.array_equal(idx, eval_prediction.train_index(10_000, 4, cap=1_000))
    # the generator's fleets stay below the cap: their figures do not depend on it
    assert 500 * 0.8 * 288 / 2 < eval_prediction.MAX_TRAIN_WINDOWS


def test_scores_and_summaries_over_many_batches_match_each_window_alone():
    rng = np.random.default_rng(3)
    n = 3 * 4096 + 5  # three batches, the last ones longer
    e = datasets.Entity("e", np.arange(float(n)), rng.normal(size=(n, 2)).astype(np.float32))
    w = make_windows([e], [clean(e, [])], 4, 3.0, 2)
    torch.manual_seed(0)
    model = fgl.LSTMClassifier(w.z.shape[1], hidden=4).eval()
    scores, summary = fgl.predict_proba(model, w), w.summary()
    assert scores.dtype == np.float32 and scores.shape == (len(w.end),)
    assert summary.dtype == np.float32 and summary.shape == (len(w.end), 3 * w.z.shape[1])
    some = np.array([0, 4095, 4096, 8191, 8192, len(w.end) - 1])
    with torch.no_grad():
        alone = torch.softmax(model(w.batch(some)), dim=1)[:, 1].numpy()
    assert np.allclose(scores[some], alone, rtol=0, atol=1e-6)
    x = w.batch(some).numpy()
    expected = np.concatenate([x[:, -1], x.mean(axis=1), x[:, -1] - x[:, 0]], axis=1)
    assert np.array_equal(summary[some], expected)
