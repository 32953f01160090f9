"""Future-Guided Learning on a small generated fleet, fixed seeds."""

import numpy as np
import pytest
import torch

from services.health import eval_prediction, fgl, transceiver
from services.health.datasets import PredictionSet


def fleet(train: tuple[int, int], test: tuple[int, int]) -> PredictionSet:
    """Generated transceivers: (modules, seed) for the training and the test entities."""
    return PredictionSet(
        "transceiver",
        list(transceiver.CHANNELS),
        transceiver.generate(*train, prefix="a"),
        transceiver.generate(*test, prefix="b"),
        transceiver.HORIZON_H,
        "hours",
        transceiver.STEP_H,
        transceiver.NOTES,
    )


@pytest.fixture(scope="module")
def small_fleet():
    return fleet((100, 11), (50, 12))


@pytest.fixture(scope="module")
def result(small_fleet, monkeypatch_module):
    monkeypatch_module.setitem(eval_prediction.SETTINGS["transceiver"], "stride", 4)
    torch.set_num_threads(1)
    return eval_prediction.run(
        small_fleet, 0, fgl.TrainConfig(epochs=4), methods=["fgl_student", "lstm", "threshold_rule"]
    )


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def test_student_predicts_precursor_failures_hours_ahead(result):
    s = result["methods"]["fgl_student"]
    assert s["precursor_ge_2h"]["recall"] == 1.0  # 13 failures that show a precursor >= 2 h
    assert s["precursor_ge_2h"]["f1"] > 0.85
    assert s["entity"]["mean_lead"] > 3.0  # hours
    # sudden deaths give no warning: catching most of them would mean leaked labels
    assert s["sudden_death"]["recall"] < 0.5


def test_every_method_is_reported_on_the_same_test_entities(result):
    ms = result["methods"]
    assert {"fgl_student", "lstm", "threshold_rule", "fgl_teacher_not_deployable"} <= set(ms)
    assert len({m["entity"]["positives"] for m in ms.values()}) == 1


def test_teacher_sees_the_future_and_is_frozen(small_fleet):
    (fit, _), _, _ = eval_prediction._build(small_fleet, 0)
    idx = np.arange(0, len(fit.end), 8)
    assert (fit.future_end >= fit.end).all() and (fit.future_end > fit.end).any()
    teacher, student = fgl.train_fgl(fit, idx, fgl.TrainConfig(epochs=1))
    assert not any(p.requires_grad for p in teacher.parameters())
    assert all(p.requires_grad for p in student.parameters())
    p = fgl.predict_proba(student, fit, idx)
    assert p.shape == idx.shape and ((p >= 0) & (p <= 1)).all()


def test_features_pool_lanes_and_count_bursts_causally():
    # channels 0-3: one quantity on four lanes; 4: a gauge; 5: a counter's increments
    x = np.zeros((30, 6), np.float32)
    x[20:, 2] = 3.0  # lane 2 climbs after sample 20
    x[25, 5] = 4.0  # one burst
    out = eval_prediction.features(x, 10, counters=[5], lanes=[[0, 1, 2, 3]])
    # gauge, counter, lowest lane, highest lane, counter's history mean
    assert out.shape == (30, 5)
    assert out[-1].tolist() == pytest.approx([0.0, 0.0, 0.0, 3.0, 4.0 / 30])
    # the same climb on lane 0 gives the same inputs
    y = x.copy()
    y[:, [0, 2]] = y[:, [2, 0]]
    assert np.array_equal(eval_prediction.features(y, 10, [5], [[0, 1, 2, 3]]), out)
    # causal: the history mean is 0 until the burst, then its share of the samples so far
    assert (out[:25, 4] == 0).all() and out[25, 4] == pytest.approx(4.0 / 26)
    z = x.copy()
    z[27:] = 9.0
    assert np.array_equal(eval_prediction.features(z, 10, [5], [[0, 1, 2, 3]])[:27], out[:27])
    # no lanes and no counters (C-MAPSS): the channels against their baseline, unchanged
    assert np.array_equal(eval_prediction.features(x, 10, [], []), x - np.median(x[:10], 0))


def test_class_balance_follows_the_data_set():
    y = np.array([0, 0, 0, 1])
    assert fgl._class_weights(y, True).tolist() == [1.0, 3.0]
    assert fgl._class_weights(y, False).tolist() == [1.0, 1.0]
    assert eval_prediction.SETTINGS["transceiver"]["balanced"] is False
    assert eval_prediction.DEFAULT["balanced"] is True  # C-MAPSS and csv keep balancing


def test_the_same_seed_trains_the_same_networks():
    # Two runs of the same command must print the same figures: the data, the split, the
    # windows, the batch order and the initial weights all follow the seed.
    def once():
        ds = fleet((16, 21), (6, 22))
        (fit, _), (val, _), _ = eval_prediction._build(ds, 3)
        idx = np.arange(0, len(fit.end), 16)
        cfg = fgl.TrainConfig(epochs=1, seed=3, balanced=False)
        _, student = fgl.train_fgl(fit, idx, cfg)
        lstm = fgl.train_lstm(fit, idx, cfg)
        return fgl.predict_proba(student, val), fgl.predict_proba(lstm, val)

    first, second = once(), once()
    assert np.array_equal(first[0], second[0]) and np.array_equal(first[1], second[1])
    assert not np.array_equal(first[0], first[1])  # the teacher changed the student


def test_prediction_results_name_their_environment():
    env = eval_prediction.environment()
    assert env["torch"] == torch.__version__ and env["threads"] == torch.get_num_threads()
    assert env["cpu_capability"]
