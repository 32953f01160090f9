"""Evaluate the health detectors and failure predictors on one data set.

    python -m services.health.eval --dataset smd|asd|cmapss|transceiver|csv:PATH
        [--output table|json] [--machines M ...] [--seed N] [--horizon H]

Every method's figures come from one run. ``--output json`` prints one JSON object.
A missing data set exits with code 2 and one line saying where to get it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import torch

from services.health import datasets, eval_detection, eval_prediction, transceiver


def load(name: str, machines: list[str] | None, seed: int, horizon: float | None):
    if name == "smd":
        return datasets.load_smd(machines)
    if name == "asd":
        return datasets.load_asd(machines)
    if name == "cmapss":
        return datasets.load_cmapss(horizon or 30.0)
    if name == "transceiver":
        return transceiver.load_transceiver(seed)
    if name.startswith("csv:"):
        return datasets.load_csv(name[4:], horizon or 24.0, seed)
    raise ValueError(f"unknown dataset {name!r}: smd, asd, cmapss, transceiver or csv:PATH")


def run(name: str, machines=None, seed: int = 0, horizon: float | None = None) -> dict:
    ds = load(name, machines, seed, horizon)
    if isinstance(ds, datasets.DetectionSet):
        return eval_detection.run(ds, seed)
    return eval_prediction.run(ds, seed)


def _clean(o):
    """JSON has no NaN: write null."""
    if isinstance(o, float):
        return None if math.isnan(o) or math.isinf(o) else round(o, 4)
    if isinstance(o, dict):
        return {str(k): _clean(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [_clean(v) for v in o]
    return o


def _f(x) -> str:
    return "   -  " if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:6.3f}"


def _detection_table(r: dict) -> list[str]:
    head = f"{'method':18s} {'P':>6s} {'R':>6s} {'F1':>6s} {'PA-F1':>6s} {'ev-rec':>6s} " \
           f"{'delay':>6s} {'bestF1*':>7s}"
    lines = [f"{r['dataset']}: mean over {len(r['machines'])} machines "
             f"(threshold: {r['threshold_rule']})", head]
    for n, m in r["mean"].items():
        p, e = m["point"], m["event"]
        lines.append(f"{n:18s} {_f(p['precision'])} {_f(p['recall'])} {_f(p['f1'])} "
                     f"{_f(m['point_adjusted']['f1'])} {_f(e['event_recall'])} "
                     f"{_f(e['mean_delay'])} {_f(m['best_f1_optimistic'])}")
    lines.append("* best F1 over test thresholds: OPTIMISTIC (uses test labels), not a result")
    lines.append("per machine, F1 / PA-F1:")
    names = list(r["mean"])
    lines.append(f"{'machine':14s} " + " ".join(f"{n[:17]:>17s}" for n in names))
    for mach, res in r["per_machine"].items():
        cells = [f"{res[n]['point']['f1']:.3f} / {res[n]['point_adjusted']['f1']:.3f}"
                 for n in names]
        lines.append(f"{mach:14s} " + " ".join(f"{c:>17s}" for c in cells))
    ref = r.get("reference_not_our_result")
    if ref:
        lines.append("reference, NOT our result: " + "; ".join(f"{k}={v}" for k, v in ref.items()))
    return lines


def _prediction_table(r: dict) -> list[str]:
    u = r["time_unit"]
    lines = [f"{r['dataset']}: predict failure within {r['horizon']} {u}; entities "
             f"fit/val/test {r['entities']['fit']}/{r['entities']['validation']}/"
             f"{r['entities']['test']}; alarm = {r['persist']} consecutive windows",
             f"{'method':27s} {'win-F1':>6s} {'ent-P':>6s} {'ent-R':>6s} {'ent-F1':>6s} "
             f"{'lead':>6s} {'pre-R':>6s} {'pre-F1':>6s} {'sud-R':>6s}"]
    for n, m in r["methods"].items():
        e = m["entity"]
        pre, sud = m.get("precursor_ge_2h", {}), m.get("sudden_death", {})
        lines.append(f"{n:27s} {_f(m['window']['f1'])} {_f(e['precision'])} "
                     f"{_f(e['recall'])} {_f(e['f1'])} {_f(e['mean_lead'])} "
                     f"{_f(pre.get('recall'))} {_f(pre.get('f1'))} {_f(sud.get('recall'))}")
    lines.append(f"lead = mean {u} from first alarm to failure over caught entities; "
                 "pre = failures with >= 2 h of precursor (+ all healthy); sud = sudden deaths")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m services.health.eval", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--output", choices=["table", "json"], default="table")
    ap.add_argument("--machines", nargs="*", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--horizon", type=float, default=None,
                    help="prediction horizon in the data's time unit (cmapss: 30 cycles)")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)  # the machine is shared: one core per evaluation
    try:
        r = _clean(run(a.dataset, a.machines, a.seed, a.horizon))
    except datasets.DatasetMissing as e:
        print(f"Error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    if a.output == "json":
        print(json.dumps(r))
    else:
        table = _detection_table if r["task"] == "detection" else _prediction_table
        print("\n".join(table(r)))
        print(f"({r['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
