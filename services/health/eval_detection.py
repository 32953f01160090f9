"""Anomaly-detection evaluation (smd, asd, csv with a label column).

Per machine, every detector fits on the training series alone; its threshold is the
0.99 quantile of its scores on the last 20% of that training series (held out from the
fit). The test series is then scored once and judged point-wise, point-adjusted and per
event. The best-F1-over-test-thresholds figure is printed too, labelled optimistic: it
picks the threshold with the test labels and so is no deployable result.
"""

from __future__ import annotations

import time

import numpy as np

from services.health import detectors, metrics
from services.health.datasets import DetectionSet

# Published figures, quoted with their protocol; they are not results of this code.
REFERENCE = {
    "smd": {
        "method": "OmniAnomaly (Su et al., KDD 2019, Table 2)",
        "protocol": "all 28 SMD machines; threshold by POT (extreme value theory) on "
                    "training scores; point-adjusted precision/recall/F1",
        "precision": 0.8334, "recall": 0.9449, "f1_point_adjusted": 0.8857,
        "f1_best_point_adjusted_optimistic": 0.9620,
        "note": "point-adjusted only; machines differ from ours (we have 6 of 28)",
    },
    "asd": {
        "method": "OmniAnomaly on ASD (reported by Li et al., KDD 2021, InterFusion)",
        "protocol": "best F1 over all thresholds with point adjustment (optimistic); "
                    "12 servers",
        "note": "figure not reproduced here: check the InterFusion paper's table",
    },
}


def _one(det: detectors.Detector, train, test, labels) -> dict:
    det.fit(train)
    s = det.score(test)
    pred = s >= det.threshold
    return {
        "point": metrics.prf(labels, pred),
        "point_adjusted": metrics.prf_point_adjusted(labels, pred),
        "event": metrics.event_recall_delay(labels, pred),
        "best_f1_optimistic": metrics.best_f1(labels, s)["f1"],
    }


def _mean(rows: list[dict]) -> dict:
    """Mean over machines of every number, keeping the nesting."""
    out = {}
    for k, v in rows[0].items():
        if isinstance(v, dict):
            out[k] = _mean([r[k] for r in rows])
        else:
            vals = np.array([r[k] for r in rows], dtype=float)
            out[k] = float(np.nanmean(vals)) if np.isfinite(vals).any() else float("nan")
    return out


def run(ds: DetectionSet, seed: int = 0, methods: list[str] | None = None) -> dict:
    t0 = time.time()
    names = methods or list(detectors.ALL)
    per_machine = {}
    for m in ds.machines:
        per_machine[m.name] = {
            n: _one(detectors.ALL[n](seed=seed), m.train, m.test, m.labels) for n in names
        }
    mean = {n: _mean([per_machine[m][n] for m in per_machine]) for n in names}
    base = ds.name.split(":")[0]
    return {
        "dataset": ds.name, "task": "detection", "seed": seed,
        "threshold_rule": "0.99 quantile of scores on the last 20% of the training series",
        "machines": list(per_machine), "mean": mean, "per_machine": per_machine,
        "reference_not_our_result": REFERENCE.get(base),
        "seconds": round(time.time() - t0, 1),
    }
