"""Failure-prediction evaluation (cmapss, transceiver, csv with failure times).

Protocol, the same for every method:
1. The training entities are split 80/20 (seeded, by entity) into fit and validation.
2. Each method learns from the fit entities only: the FGL teacher and student and the
   LSTM from labelled windows; Isolation Forest, PCA and the threshold rule from the
   windows labelled "not failing within the horizon" (what a healthy fleet looks like).
3. Its alarm threshold is the one that maximises entity-level F1 on the validation
   entities (alarms must hold for ``PERSIST`` consecutive windows).
4. Test entities are scored once: window-level precision/recall/F1 and entity-level
   precision/recall/F1 with lead time (see metrics.entity_prediction).
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import torch

from services.health import detectors, fgl, metrics
from services.health.datasets import PredictionSet
from services.health.memory import release_freed
from services.health.windows import Scaler, Windows, clean, counter_columns, make_windows

PERSIST = 2
# Window length, training stride and teacher shift in samples; baseline = how many first
# samples of an entity define its own healthy levels; balanced = class-weighted loss.
# Transceiver windows are not balanced: most windows labelled "fails within 24 h" look
# healthy (sudden deaths, the hours before a precursor shows), and weighting them up
# drives the network to tell healthy-looking windows apart by their noise. Unweighted,
# they stay at the base rate, and the validation threshold sets the operating point.
SETTINGS = {
    "transceiver": {"length": 24, "stride": 2, "shift": 24, "baseline": 24, "balanced": False},
    "cmapss": {"length": 30, "stride": 1, "shift": 8, "baseline": 20},
}
DEFAULT = {"length": 24, "stride": 2, "shift": None, "baseline": 24, "balanced": True}
RELATIVE_ONLY = True


def _with_baseline(x: np.ndarray, n: int) -> np.ndarray:
    """Express each channel against the entity's own first ``n`` samples. Modules and
    engines differ in their healthy levels; a failure shows as a departure from one's own
    normal, and models that see absolute levels learn which units failed in training
    instead of what failing looks like."""
    rel = x - np.median(x[:n], axis=0)
    return rel if RELATIVE_ONLY else np.concatenate([x, rel], axis=1)


def _history_mean(col: np.ndarray) -> np.ndarray:
    """Mean of a channel over the entity's past up to each sample (causal). For a counter
    it says how often this module usually bursts, which a window of a few hours cannot:
    a link that bursts all week is not one that just started."""
    return np.cumsum(col) / np.arange(1, len(col) + 1)


def features(x: np.ndarray, baseline: int, counters: list[int], lanes: list[list[int]]):
    """Scaled, cleaned channels -> model inputs: each channel against the entity's first
    ``baseline`` samples, then the counters' history means.

    Each group of ``lanes`` (a module's four Tx, Rx or bias channels) becomes two
    channels, its lowest and its highest departure. A failure strikes one lane,
    whichever it is: per-lane inputs make the model learn each pattern four times over,
    from a quarter of the examples, and tell a healthy module's bias step on one lane
    from a failing module's bias climb on another by the lane."""
    rel = _with_baseline(x, baseline)
    in_lanes = {c for g in lanes for c in g}
    cols = [rel[:, c] for c in range(rel.shape[1]) if c not in in_lanes]
    for g in lanes:
        cols += [rel[:, g].min(axis=1), rel[:, g].max(axis=1)]
    cols += [_history_mean(rel[:, c]) for c in counters]
    return np.column_stack(cols).astype(np.float32)


MIN_TRAIN_ENTITIES = 3  # 80/20 into fit and validation: fewer leave validation empty


def _split(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    if n < MIN_TRAIN_ENTITIES:
        raise ValueError(
            f"{n} training entities: prediction needs at least {MIN_TRAIN_ENTITIES} (a fifth "
            "of them, at least one, is held out to set the alarm threshold)"
        )
    order = np.random.default_rng(seed).permutation(n)
    cut = int(round(0.8 * n))
    return np.sort(order[:cut]), np.sort(order[cut:])


def settings(ds: PredictionSet) -> dict:
    """The window settings of the data set, or of the profile a csv file asked for."""
    return {**DEFAULT, **SETTINGS.get(ds.notes.get("profile", ds.name), {})}


def _release(e, release_raw: bool) -> None:
    """Drop an entity's raw rows once they are cleaned (``release_raw``): on a large
    export they are as big as the windows, and nothing after cleaning reads them."""
    if release_raw:
        e.x, e.exact = e.x[:0], {}


def _clean_rows(ents, counters, deltas, release_raw: bool):
    """The cleaned rows of ``ents`` in one float32 array (no per-entity copies beside
    it), and each entity's slice of it."""
    width = ents[0].x.shape[1] + 1 if ents else 0
    rows = np.empty((sum(len(e.t) for e in ents), width), dtype=np.float32)
    cuts, at = [], 0
    for e in ents:
        rows[at : at + len(e.t)] = clean(e, counters, deltas)
        _release(e, release_raw)
        cuts.append(slice(at, at + len(e.t)))
        at += len(e.t)
    return rows, cuts


def _build(ds: PredictionSet, seed: int, release_raw: bool = False):
    """(fit, validation, test) windows, each with its entities. Built one entity at a
    time into one array per set: the fit rows are cleaned once into one array (the
    scaler's input), validation and test rows are cleaned as their windows are made,
    and with ``release_raw`` each entity's raw rows are dropped once cleaned."""
    st = settings(ds)
    shift = st["shift"] or max(1, int(ds.horizon / ds.step / 4))
    counters = counter_columns(ds)
    deltas = tuple(counter_columns(ds, "deltas"))
    lanes = [[ds.channels.index(c) for c in g] for g in ds.notes.get("lanes", [])]
    fit_i, val_i = _split(len(ds.train), seed)
    fit_e = [ds.train[i] for i in fit_i]
    val_e = [ds.train[i] for i in val_i]
    fit_rows, cuts = _clean_rows(fit_e, counters, deltas, release_raw)
    scale = Scaler().fit(fit_rows)

    def feats(cleaned):
        for x in cleaned:
            yield features(scale(x), st["baseline"], counters + list(deltas), lanes)

    def cleaned(ents):
        for e in ents:
            x = clean(e, counters, deltas)
            _release(e, release_raw)
            yield x

    def win(ents, xs, stride):
        return make_windows(ents, feats(xs), st["length"], ds.horizon, shift, stride), ents

    fit = win(fit_e, (fit_rows[c] for c in cuts), st["stride"])
    del fit_rows  # the fit windows hold its features; the cleaned rows are done with
    release_freed()
    out = fit, win(val_e, cleaned(val_e), 1), win(ds.test, cleaned(ds.test), 1)
    release_freed()
    return out


def _choose_threshold(scores: np.ndarray, w: Windows, ents) -> float:
    """Threshold with the best entity-level F1 on validation; ties go to the middle of the
    tied range so a small shift in score scale does not fall off an edge."""
    f = np.array([e.failure_time for e in ents])
    cands = np.unique(np.quantile(scores, np.linspace(0.5, 1.0, 201)))
    f1s = np.array(
        [
            metrics.entity_prediction(
                w.y, metrics.alarms(scores >= c, w.entity, PERSIST), w.entity, w.t, f
            )["f1"]
            for c in cands
        ]
    )
    best = np.flatnonzero(f1s >= f1s.max() - 1e-12)
    return float(cands[best[len(best) // 2]])


def _report(scores, thr, w: Windows, ents) -> dict:
    f = np.array([e.failure_time for e in ents])
    alarm = metrics.alarms(scores >= thr, w.entity, PERSIST)
    out = {
        "threshold": thr,
        "window": metrics.prf(w.y, alarm),
        "entity": metrics.entity_prediction(w.y, alarm, w.entity, w.t, f),
    }
    kinds = np.array([e.kind for e in ents])
    if "sudden_death" in kinds:  # the generator knows which failures gave warning
        healthy = ~np.isfinite(f)
        shows = np.array([e.visible_warning for e in ents])
        out["precursor_ge_2h"] = _subset(w, alarm, f, healthy | (shows >= 2.0))
        # The same subset by the precursor's onset, visible or not yet (for comparison).
        onset = np.array([e.warning for e in ents])
        out["onset_ge_2h"] = _subset(w, alarm, f, healthy | (onset >= 2.0))
        out["sudden_death"] = _subset(w, alarm, f, kinds == "sudden_death")
        out["by_mode_recall"] = {
            k: _subset(w, alarm, f, kinds == k)["recall"]
            for k in sorted(set(kinds))
            if np.isfinite(f[kinds == k]).all()
        }
    return out


def _subset(w: Windows, alarm, f, keep_entity: np.ndarray) -> dict:
    m = keep_entity[w.entity]
    return metrics.entity_prediction(w.y[m], alarm[m], w.entity[m], w.t[m], f)


def _unsupervised(name: str, fit: Windows, seed: int, cap: int = 20000):
    """Point detectors on window summaries, fitted on windows of the healthy regime.
    Windows are scored a run at a time (``Windows.parts``): the scores are the same,
    and a large fleet's summaries never exist all at once."""
    rng = np.random.default_rng(seed)
    idx = np.flatnonzero(fit.y == 0)
    idx = np.sort(rng.choice(idx, min(cap, len(idx)), replace=False))
    det = detectors.ALL[name](seed=seed)
    det.fit_model(fit.summary(idx))  # the threshold comes from the validation entities
    return lambda w: _score_parts(det, w)


def _score_parts(det, w: Windows) -> np.ndarray:
    out = [det.score(w.summary(part)) for part in w.parts()]
    return np.concatenate(out) if out else np.zeros(0)


# The networks train on at most this many windows: beyond it, on a seeded uniform sample
# of the fit windows (the same sample for teacher, student and LSTM). The rule looks at
# nothing but the count, and no built-in data set reaches it (transceiver: about 58,000
# fit windows; C-MAPSS: about 16,000); a fleet export of hundreds of MB has millions,
# and more windows of the same fleet cost time in every epoch but add little.
MAX_TRAIN_WINDOWS = 200_000


def train_index(n: int, seed: int, cap: int = MAX_TRAIN_WINDOWS) -> np.ndarray:
    """Indices of the fit windows the networks train on: all of them up to ``cap``,
    else ``cap`` of them drawn uniformly (seeded), in order."""
    if n <= cap:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, cap, replace=False))


def environment() -> dict:
    """What the networks' figures depend on beside the code and the seed. Two runs in
    one environment print the same figures. Torch picks its CPU kernels by instruction
    set (``cpu_capability``), and kernels of another set, or of another torch build,
    round differently: the same seed's network then ends its training with other
    weights, and its figures can move by a module or so."""
    return {
        "torch": torch.__version__,
        "numpy": np.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
    }


def run(
    ds: PredictionSet,
    seed: int = 0,
    cfg: fgl.TrainConfig | None = None,
    methods: list[str] | None = None,
    release_raw: bool = False,
) -> dict:
    """``release_raw``: drop each entity's raw rows once cleaned (the caller is done with
    them; ``stalwart health eval`` is), so they are not held through training."""
    for which, ents in (("train", ds.train), ("test", ds.test)):
        if not ents:
            raise ValueError(
                f"{ds.name}: no {which} entity among {len(ds.train) + len(ds.test)} "
                "(evaluating needs both: more entities, or a 'split' column)"
            )
    cfg = cfg or fgl.TrainConfig(seed=seed)
    if cfg.balanced is None:
        cfg = dataclasses.replace(cfg, balanced=settings(ds)["balanced"])
    (fit, _), (val, val_e), (test, test_e) = _build(ds, seed, release_raw)
    idx = train_index(len(fit.end), seed)
    scorers = {}
    t0 = time.time()
    teacher, student = fgl.train_fgl(fit, idx, cfg)
    scorers["fgl_student"] = lambda w: fgl.predict_proba(student, w)
    lstm = fgl.train_lstm(fit, idx, cfg)
    scorers["lstm"] = lambda w: fgl.predict_proba(lstm, w)
    for name in ("isolation_forest", "pca", "threshold_rule"):
        scorers[name] = _unsupervised(name, fit, seed)
    results = {}
    for name, score in scorers.items():
        if methods and name not in methods:
            continue
        thr = _choose_threshold(score(val), val, val_e)
        results[name] = _report(score(test), thr, test, test_e)
    # The teacher reads windows that end later than "now": a reference, not deployable.
    tv = fgl.predict_proba(teacher, val, future=True)
    results["fgl_teacher_not_deployable"] = _report(
        fgl.predict_proba(teacher, test, future=True),
        _choose_threshold(tv, val, val_e),
        test,
        test_e,
    )
    return {
        "dataset": ds.name,
        "task": "prediction",
        "seed": seed,
        "horizon": ds.horizon,
        "time_unit": ds.time_unit,
        "persist": PERSIST,
        "train_windows": {"fit": int(len(fit.end)), "trained_on": int(len(idx))},
        "entities": {
            "fit": int(len(set(fit.entity))),
            "validation": len(val_e),
            "test": len(test_e),
        },
        "methods": results,
        "environment": environment(),
        "seconds": round(time.time() - t0, 1),
    }
