"""Metric functions on hand-computed cases."""

import math

import numpy as np
import pytest

from services.health import metrics as m


def test_prf_counts():
    # tp=2, fp=1, fn=2 -> P=2/3, R=1/2, F1=4/7
    r = m.prf([1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 1, 0])
    assert r["precision"] == pytest.approx(2 / 3)
    assert r["recall"] == pytest.approx(0.5)
    assert r["f1"] == pytest.approx(4 / 7)


def test_prf_empty_is_zero_not_nan():
    assert m.prf([0, 0], [0, 0]) == {"precision": 0.0, "recall": 0.0, "f1": 0.0}


def test_segments_half_open():
    assert m.segments([0, 1, 1, 0, 1, 0, 1, 1]) == [(1, 3), (4, 5), (6, 8)]
    assert m.segments([0, 0]) == []


def test_point_adjust_fills_hit_segments_only():
    y = [0, 1, 1, 1, 0, 1, 1, 0]
    p = [1, 0, 1, 0, 0, 0, 0, 0]
    assert m.point_adjust(y, p).astype(int).tolist() == [1, 1, 1, 1, 0, 0, 0, 0]
    # tp=3, fp=1, fn=2 -> P=3/4, R=3/5, F1=2/3
    r = m.prf_point_adjusted(y, p)
    assert r["precision"] == pytest.approx(0.75)
    assert r["recall"] == pytest.approx(0.6)
    assert r["f1"] == pytest.approx(2 / 3)


def test_event_recall_and_delay():
    y = [1, 1, 1, 0, 0, 1, 1, 0, 1]
    p = [0, 0, 1, 0, 1, 1, 0, 0, 0]
    r = m.event_recall_delay(y, p)
    assert r["events"] == 3
    assert r["event_recall"] == pytest.approx(2 / 3)
    assert r["mean_delay"] == pytest.approx((2 + 0) / 2)


def test_best_f1_finds_separating_threshold():
    y = np.array([0, 0, 0, 1, 1])
    s = np.array([0.1, 0.2, 0.3, 0.8, 0.9])
    assert m.best_f1(y, s)["f1"] == pytest.approx(1.0)


def test_lead_times_ignore_late_alerts():
    r = m.lead_times([5.0, float("nan"), 12.0], [10.0, 10.0, 10.0])
    assert r["recall"] == pytest.approx(1 / 3)
    assert r["mean_lead"] == pytest.approx(5.0)


def test_alarms_need_persistence_within_one_entity():
    pred = [1, 1, 0, 1, 1, 1]
    ent = [0, 0, 0, 0, 1, 1]
    assert m.alarms(pred, ent, 2).tolist() == [False, True, False, False, False, True]
    assert m.alarms(pred, ent, 1).tolist() == [bool(v) for v in pred]


def test_entity_prediction_counts_early_alarms_as_false():
    # entity 0 fails at t=3 (windows 1, 2 labelled); entity 1 never fails;
    # entity 2 fails at t=3 but its only alarm comes before the horizon.
    y = [0, 1, 1, 0, 0, 0, 1]
    alarm = [0, 0, 1, 1, 0, 1, 0]
    ent = [0, 0, 0, 1, 1, 2, 2]
    t = [0, 1, 2, 0, 1, 0, 2]
    r = m.entity_prediction(y, alarm, ent, t, [3.0, math.nan, 3.0])
    assert (r["positives"], r["false_alarms"]) == (2, 2)
    assert r["recall"] == pytest.approx(0.5)
    assert r["precision"] == pytest.approx(1 / 3)
    assert r["mean_lead"] == pytest.approx(1.0)


def test_causal_mean_restarts_per_entity():
    s = m.causal_mean([1.0, 3.0, 5.0, 10.0, 20.0], [0, 0, 0, 1, 1], 2)
    assert s.tolist() == [1.0, 2.0, 4.0, 10.0, 15.0]


def test_best_f1_with_ties_is_an_upper_bound():
    y = np.array([1, 0, 1, 1, 0, 0, 1])
    s = np.array([0.9, 0.9, 0.5, 0.7, 0.2, 0.5, 0.1])
    best = m.best_f1(y, s)["f1"]
    for thr in np.unique(s):
        assert m.prf(y, s >= thr)["f1"] <= best + 1e-12
    # cut at 0.5 flags 0.9, 0.9, 0.7, 0.5, 0.5: tp=3, fp=2 -> F1 = 6/9
    assert best == pytest.approx(max(6 / 9, m.prf(y, s >= 0.1)["f1"]))
