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


def best_f1(y_true, scores, max_thresholds: int = 512) -> dict[str, float]:
    """Best point-wise F1 over thresholds taken from the test scores themselves.

    OPTIMISTIC: the threshold is chosen with the test labels. It is an upper bound on
    what the score could achieve, not a deployable figure; callers label it so."""
    t = _as_bool(y_true)
    s = np.asarray(scores, dtype=float).ravel()
    qs = np.unique(np.quantile(s, np.linspace(0.0, 1.0, max_thresholds)))
    best = {"precision": 0.0, "recall": 0.0, "f1": 0.0, "threshold": float("nan")}
    for q in qs:
        r = prf(t, s >= q)
        if r["f1"] > best["f1"]:
            best = {**r, "threshold": float(q)}
    return best


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
