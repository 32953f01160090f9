"""Robust scaling, the leave-machines-out selection rule and the multi-seed summary, on
small synthetic arrays."""

import warnings

import numpy as np
import pytest

from services.health import eval_detection, scaling, seeds


def test_scaler_floors_a_metric_that_barely_moved_and_clips():
    rng = np.random.default_rng(0)
    # Column 0: normal, sd 1. Column 1: quantised to 0.01 and nearly constant (a few
    # steps of one quantum). Column 2: constant.
    quiet = np.where(rng.random(1000) < 0.02, 0.51, 0.50)
    x = np.column_stack([rng.normal(0, 1, 1000), quiet, np.full(1000, 3.0)])
    sc = scaling.RobustScaler().fit(x)
    assert sc.spread[0] == pytest.approx(1.0, rel=0.1)
    # IQR of column 1 is 0: its spread is its resolution, one step of 0.01.
    assert sc.spread[1] == pytest.approx(0.01)
    assert sc.constant.tolist() == [False, False, True]
    z = sc.transform(np.array([[0.0, 0.50 + 0.28, 3.5], [np.nan, 0.5, 3.0]]))
    assert z.shape == (2, 2)  # the constant metric is dropped
    assert z[0, 1] == scaling.CLIP  # 28 quanta out: clipped, not 28
    assert z[1].tolist() == [0.0, 0.0]  # a missing value sits at the centre


def test_scaler_floor_follows_the_training_range():
    x = np.r_[np.zeros(1000), np.linspace(0, 1, 300)][:, None]  # IQR 0, step 1/299
    sc = scaling.RobustScaler().fit(x)
    assert sc.spread[0] == pytest.approx(0.01)  # 1% of the range, above the step
    assert scaling.resolution(np.array([1.0, 2.0, 2.0, 4.0])) == 1.5


def _res(f1, pa):
    return {
        "point": {"f1": f1, "precision": f1, "recall": f1},
        "point_adjusted": {"f1": pa, "precision": pa, "recall": pa},
        "event": {"event_recall": 1.0, "mean_delay": 1.0},
        "best_f1_optimistic": 1.0,
    }


def _scores(table):
    """table[machine][detector] = (f1, pa) at 0.99; the other levels a little worse."""
    return {
        m: {
            d: {q: _res(f - (q > 0.99) * 0.01, p) for q in eval_detection.QUANTILES}
            for d, (f, p) in dets.items()
        }
        for m, dets in table.items()
    }


def test_choice_is_made_on_the_tuning_machines_only():
    s = _scores(
        {
            "a": {"pca": (0.2, 0.5), "forecast": (0.4, 0.6)},
            "b": {"pca": (0.2, 0.5), "forecast": (0.5, 0.7)},
            # On c, PCA is far better: a rule that peeked at c would pick it.
            "c": {"pca": (0.9, 0.9), "forecast": (0.1, 0.1)},
        }
    )
    assert eval_detection.choose(s, ["a", "b"]) == ("forecast", 0.99)
    r = eval_detection.holdout(s, ["c"])
    assert r["chosen_as"] == {"c": "forecast@0.99"}
    assert r["mean"]["chosen"]["point"]["f1"] == pytest.approx(0.1)
    assert r["goal_beats_pca"] == {"raw_f1": False, "pa_f1": False, "met": False}


def test_leave_one_out_reports_every_machine_with_the_others_choice():
    s = _scores(
        {
            "a": {"pca": (0.3, 0.5), "forecast": (0.6, 0.7)},
            "b": {"pca": (0.3, 0.5), "forecast": (0.6, 0.7)},
            "c": {"pca": (0.3, 0.5), "forecast": (0.2, 0.4)},
        }
    )
    r = eval_detection.holdout(s, None)
    assert r["reported"] == ["a", "b", "c"]
    assert set(r["chosen_as"].values()) == {"forecast@0.99"}
    assert r["mean"]["chosen"]["point"]["f1"] == pytest.approx((0.6 + 0.6 + 0.2) / 3)
    assert r["goal_beats_pca"]["met"] is True
    with pytest.raises(ValueError, match="no machine left"):
        eval_detection.holdout(s, ["a", "b", "c"])


def test_parse_seeds():
    assert seeds.parse_seeds("0-3,7,2") == [0, 1, 2, 3, 7]
    for bad in ("x", "3-1", "1-", "-2"):
        with pytest.raises(ValueError, match="--seeds"):
            seeds.parse_seeds(bad)


def _run(student, lstm):
    return {
        "methods": {
            "fgl_student": {"entity": {"f1": student[0], "false_alarms": student[1]}},
            "lstm": {"entity": {"f1": lstm[0], "false_alarms": lstm[1]}},
        }
    }


def test_summary_counts_wins_margin_and_false_alarms():
    per = {s: _run((0.90, 1), (0.86, 1)) for s in range(9)}
    per[9] = _run((0.80, 3), (0.85, 0))
    r = seeds.summarise(per)
    c = r["student_vs_lstm"]
    assert (c["wins"], c["ties"], c["losses"]) == (9, 0, 1)
    assert c["mean_margin"] == pytest.approx((9 * 0.04 - 0.05) / 10)
    assert r["methods"]["fgl_student"]["false_alarms"] == 12
    # 9 of 10 wins and a 0.031 margin, but more false alarms (12 vs 9): not met.
    assert c["goal"] == {"wins": True, "margin": True, "false_alarms": False, "met": False}
    assert r["methods"]["lstm"]["f1_min"] == 0.85


def test_a_machine_whose_metrics_never_move_is_flagged_nowhere():
    """Every metric constant in training and in test: the test is exactly as normal as
    training, so no detector may flag a point (flagging at a score equal to the
    threshold flagged them all), and none warns about dividing by its zero variance."""
    from services.health import detectors
    from services.health.datasets import DetectionSet, Machine

    flat = np.full((300, 3), [1.0, 0.0, 5.0], dtype=np.float32)
    labels = np.zeros(300, dtype=int)
    labels[100:110] = 1
    ds = DetectionSet("flat", [Machine("m", flat, flat.copy(), labels)])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        r = eval_detection.run(ds, methods=["threshold_rule", "pca", "isolation_forest"])
    for name, res in r["per_machine"]["m"].items():
        assert res["point"]["recall"] == 0.0, name
        assert res["point_adjusted"]["recall"] == 0.0, name
    assert set(r["per_machine"]["m"]) == {"threshold_rule", "pca", "isolation_forest"}
    assert detectors.ALL["pca"]().fit(flat).predict(flat).sum() == 0
