"""Evaluation metrics for anomaly detection and failure prediction (pure numpy).

Conventions: labels and predictions are 1-D arrays of 0/1 (or bool) aligned in time.
A *segment* (or event) is a maximal run of consecutive 1s in the labels. Every function
returns plain Python floats so results serialise to JSON without conversion.
"""

from __future__ import annotations

import numpy as np


def _as_bool(a) -> np.ndarray:
    return np.asarray(a).astype(bool).ravel()


def prf(y_true, y_pred) -> dict[str, float]:
    """Point-wise precision, recall and F1. Empty denominators give 0, not NaN."""
    t, p = _as_bool(y_true), _as_bool(y_pred)
    tp = float(np.sum(t & p))
    fp = float(np.sum(~t & p))
    fn = float(np.sum(t & ~p))
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def segments(y_true) -> list[tuple[int, int]]:
    """Maximal runs of 1s as half-open (start, end) index pairs."""
    t = _as_bool(y_true).astype(np.int8)
    edges = np.diff(np.concatenate(([0], t, [0])))
    starts = np.flatnonzero(edges == 1)
    ends = np.flatnonzero(edges == -1)
    return list(zip(starts.tolist(), ends.tolist(), strict=True))


def point_adjust(y_true, y_pred) -> np.ndarray:
    """The common point-adjust protocol: a labelled segment with any flagged point counts
    as entirely flagged. Points outside segments are left as predicted. It inflates
    scores (a single lucky hit in a long segment earns the whole segment), so it is
    always reported beside the point-wise figure, never instead of it."""
    p = _as_bool(y_pred).copy()
    for start, end in segments(y_true):
        if p[start:end].any():
            p[start:end] = True
    return p


def prf_point_adjusted(y_true, y_pred) -> dict[str, float]:
    return prf(y_true, point_adjust(y_true, y_pred))


def event_recall_delay(y_true, y_pred) -> dict[str, float]:
    """Fraction of labelled segments with at least one flagged point, and the mean delay
    (in samples) from a found segment's start to its first flagged point."""
    p = _as_bool(y_pred)
    segs = segments(y_true)
    delays = []
    for start, end in segs:
        hits = np.flatnonzero(p[start:end])
        if hits.size:
            delays.append(int(hits[0]))
    found = len(delays)
    return {
        "events": float(len(segs)),
        "event_recall": found / len(segs) if segs else 0.0,
        "mean_delay": float(np.mean(delays)) if delays else float("nan"),
    }


def best_f1(y_true, scores) -> dict[str, float]:
    """Best point-wise F1 over every threshold (flag score >= threshold), the thresholds
    being the test scores themselves.

    OPTIMISTIC: the threshold is chosen with the test labels. It is an upper bound on
    what the score could achieve, not a deployable figure; callers label it so."""
    t = _as_bool(y_true)
    s = np.asarray(scores, dtype=float).ravel()
    order = np.argsort(-s, kind="stable")
    s_sorted, t_sorted = s[order], t[order]
    tp = np.cumsum(t_sorted)
    fp = np.cumsum(~t_sorted)
    # Only the last index of each run of equal scores is a reachable cut.
    last = np.flatnonzero(np.r_[s_sorted[1:] != s_sorted[:-1], True])
    tp, fp = tp[last].astype(float), fp[last].astype(float)
    pos = float(t.sum())
    precision = tp / np.maximum(tp + fp, 1)
    recall = tp / pos if pos else np.zeros_like(tp)
    denom = precision + recall
    f1 = np.where(denom > 0, 2 * precision * recall / np.where(denom > 0, denom, 1), 0.0)
    if not f1.size:
        return {"precision": 0.0, "recall": 0.0, "f1": 0.0, "threshold": float("nan")}
    i = int(np.argmax(f1))
    return {
        "precision": float(precision[i]),
        "recall": float(recall[i]),
        "f1": float(f1[i]),
        "threshold": float(s_sorted[last[i]]),
    }


def lead_times(alert_time, failure_time) -> dict[str, float]:
    """Lead time of failure predictions, one entry per failing entity.

    alert_time[i] is the time of the first alert raised for entity i (NaN when none);
    failure_time[i] is when it failed. An alert at or after the failure is no prediction
    and counts as a miss. Returns recall over the entities and lead-time statistics over
    the ones caught, in the units of the inputs."""
    a = np.asarray(alert_time, dtype=float).ravel()
    f = np.asarray(failure_time, dtype=float).ravel()
    caught = np.isfinite(a) & (a < f)
    leads = f[caught] - a[caught]
    return {
        "failures": float(f.size),
        "recall": float(caught.mean()) if f.size else 0.0,
        "mean_lead": float(leads.mean()) if leads.size else float("nan"),
        "min_lead": float(leads.min()) if leads.size else float("nan"),
        "median_lead": float(np.median(leads)) if leads.size else float("nan"),
    }


def alarms(y_pred, entity, persist: int = 1) -> np.ndarray:
    """Raise an alarm only where the prediction has held for ``persist`` consecutive
    windows of the same entity (windows in time order, entities contiguous). One noisy
    window then does not drain a node."""
    p = _as_bool(y_pred).astype(np.int64)
    ent = np.asarray(entity).ravel()
    if persist <= 1:
        return p.astype(bool)
    c = np.concatenate(([0], np.cumsum(p)))
    held = np.zeros(len(p), dtype=bool)
    k = persist
    held[k - 1 :] = (c[k:] - c[:-k]) == k
    same = np.zeros(len(p), dtype=bool)
    same[k - 1 :] = ent[k - 1 :] == ent[: len(p) - k + 1]
    return held & same


def entity_prediction(y_true, alarm, entity, t, failure_time) -> dict[str, float]:
    """Failure prediction judged per entity, the way an operator who drains on alarm
    sees it.

    An entity is *positive* when some of its windows are labelled (it fails within the
    horizon after them). It is caught (TP) when an alarm falls on one of those windows,
    missed (FN) otherwise. An alarm on any negative window is a false alarm for that
    entity (FP): on a healthy entity, or earlier than the horizon on a failing one (a
    predictor that fires at random would otherwise "catch" failures that gave no
    warning). Lead time is failure time minus the first alarm inside the horizon, over
    the caught entities. ``failure_time`` is indexed by the entity ids in ``entity``."""
    y, a = _as_bool(y_true), _as_bool(alarm)
    ent = np.asarray(entity).ravel().astype(np.int64)
    tt = np.asarray(t, dtype=float).ravel()
    f = np.asarray(failure_time, dtype=float).ravel()
    n = int(ent.max()) + 1 if ent.size else 0
    positive = np.bincount(ent, weights=y, minlength=n) > 0
    caught = np.bincount(ent, weights=y & a, minlength=n) > 0
    false_alarm = np.bincount(ent, weights=~y & a, minlength=n) > 0
    tp = int(caught.sum())
    fn = int((positive & ~caught).sum())
    fp = int(false_alarm.sum())
    first = np.full(n, np.inf)
    hit = y & a
    np.minimum.at(first, ent[hit], tt[hit])
    leads = (f[:n] - first)[caught]
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "positives": float(tp + fn),
        "false_alarms": float(fp),
        "mean_lead": float(leads.mean()) if leads.size else float("nan"),
        "min_lead": float(leads.min()) if leads.size else float("nan"),
    }


def causal_mean(scores, entity, k: int) -> np.ndarray:
    """Mean of each window's score and the k-1 before it of the same entity (windows in
    time order, entities contiguous): a one-off spike is diluted, a sustained rise is not."""
    s = np.asarray(scores, dtype=float).ravel()
    ent = np.asarray(entity).ravel()
    c = np.concatenate(([0.0], np.cumsum(s)))
    starts = np.concatenate(([0], np.flatnonzero(ent[1:] != ent[:-1]) + 1))
    first = np.repeat(starts, np.diff(np.concatenate((starts, [len(s)]))))
    lo = np.maximum(np.arange(len(s)) - k + 1, first)
    return (c[1:] - c[lo]) / (np.arange(len(s)) + 1 - lo)
