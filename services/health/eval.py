"""Evaluate the health detectors and failure predictors on one data set.

    python -m services.health.eval --dataset smd|asd|cmapss|transceiver|csv:PATH
        [--output table|json] [--machines M ...] [--seed N] [--horizon H]
        [--holdout-machines [M ...]] [--seeds 0-9] [--profile transceiver]

Every method's figures come from one run. ``--output json`` prints one JSON object.
--holdout-machines (detection): the detector and its threshold level are chosen on the
other machines and reported on these (no names: each machine in turn).
--seeds (prediction): one run per seed; mean, spread and the student's wins vs the LSTM.

Public data sets are read from $STALWART_DATA_DIR (default: ../shared/data beside the
repository). A missing data set or a bad file exits with code 2 and one `Error: ...` line.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import torch

from services.health import (
    datasets,
    eval_detection,
    eval_prediction,
    fleetcsv,
    seeds,
    transceiver,
)


def load(
    name: str,
    machines: list[str] | None,
    seed: int,
    horizon: float | None,
    csv_opts: dict | None = None,
):
    if horizon is not None and not 0 < horizon < float("inf"):  # NaN fails it too
        raise ValueError(f"--horizon must be above 0 and finite, got {horizon:g}")
    if machines is not None and name not in ("smd", "asd"):
        raise ValueError(f"--machines is for smd and asd; {name} is evaluated whole")
    if name == "smd":
        return datasets.load_smd(machines)
    if name == "asd":
        return datasets.load_asd(machines)
    if name == "cmapss":
        return datasets.load_cmapss(30.0 if horizon is None else horizon)
    if name == "transceiver":
        return transceiver.load_transceiver(seed)
    if name.startswith(("csv:", "parquet:")):  # csv: the file's suffix says which format
        kind, path = name.split(":", 1)
        opts = {**(csv_opts or {}), "parquet": kind == "parquet" or None}
        return datasets.load_csv(path, 24.0 if horizon is None else horizon, seed, **opts)
    raise ValueError(f"unknown dataset {name!r}: smd, asd, cmapss, transceiver or csv:PATH")


def run(
    name: str,
    machines=None,
    seed: int = 0,
    horizon: float | None = None,
    holdout_machines: list[str] | None = None,
    csv_opts: dict | None = None,
) -> dict:
    ds = load(name, machines, seed, horizon, csv_opts)
    if isinstance(ds, datasets.DetectionSet):
        return eval_detection.run(ds, seed, holdout_machines=holdout_machines)
    if holdout_machines is not None:
        raise ValueError("--holdout-machines is for detection data sets (smd, asd, csv with label)")
    return eval_prediction.run(ds, seed, release_raw=True)  # ds is not read after it


def run_seeds(
    name: str, seed_list: list[int], horizon: float | None = None, csv_opts: dict | None = None
) -> dict:
    """One prediction run per seed, then the comparison over seeds. A line per seed goes
    to stderr as it finishes, so a long sweep shows progress and leaves its figures."""
    per_seed = {}
    for s in seed_list:
        r = run(name, None, s, horizon, csv_opts=csv_opts)
        if r["task"] != "prediction":
            raise ValueError(f"--seeds is for failure prediction; {name} is a detection set")
        per_seed[s] = r
        e = {m: r["methods"][m]["entity"] for m in r["methods"]}
        print(
            f"seed {s}: "
            + ", ".join(f"{m} F1 {v['f1']:.3f} FA {int(v['false_alarms'])}" for m, v in e.items())
            + f" ({r['seconds']} s)",
            file=sys.stderr,
            flush=True,
        )
    out = seeds.summarise(per_seed)
    out.update(dataset=name, task="prediction_seeds", per_seed=per_seed)
    return out


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
    head = (
        f"{'method':18s} {'P':>6s} {'R':>6s} {'F1':>6s} {'PA-F1':>6s} {'ev-rec':>6s} "
        f"{'delay':>6s} {'bestF1*':>7s}"
    )
    lines = [
        f"{r['dataset']}: mean over {len(r['machines'])} machines "
        f"(threshold: {r['threshold_rule']})",
        head,
    ]
    for n, m in r["mean"].items():
        p, e = m["point"], m["event"]
        lines.append(
            f"{n:18s} {_f(p['precision'])} {_f(p['recall'])} {_f(p['f1'])} "
            f"{_f(m['point_adjusted']['f1'])} {_f(e['event_recall'])} "
            f"{_f(e['mean_delay'])} {_f(m['best_f1_optimistic'])}"
        )
    lines.append("* best F1 over test thresholds: OPTIMISTIC (uses test labels), not a result")
    lines += _per_machine(r, 17)
    ref = r.get("reference_not_our_result")
    if ref:
        lines.append("reference, NOT our result: " + "; ".join(f"{k}={v}" for k, v in ref.items()))
    return lines


def _holdout_table(r: dict) -> list[str]:
    lines = [
        f"{r['dataset']}: leave machines out, reported on {len(r['reported'])} machines, "
        f"each with a choice tuned on the others",
        f"rule: {r['selection_rule']}",
        f"{'method':18s} {'P':>6s} {'R':>6s} {'F1':>6s} {'PA-P':>6s} {'PA-R':>6s} "
        f"{'PA-F1':>6s} {'bestF1*':>7s}",
    ]
    for n, m in r["mean"].items():
        p, a = m["point"], m["point_adjusted"]
        lines.append(
            f"{n:18s} {_f(p['precision'])} {_f(p['recall'])} {_f(p['f1'])} "
            f"{_f(a['precision'])} {_f(a['recall'])} {_f(a['f1'])} "
            f"{_f(m['best_f1_optimistic'])}"
        )
    lines.append(
        "chosen per reported machine: " + ", ".join(f"{k} {v}" for k, v in r["chosen_as"].items())
    )
    g = r["goal_beats_pca"]
    lines.append(
        "goal (chosen beats PCA on raw F1 and on PA-F1): "
        + ("MET" if g["met"] else "NOT MET")
        + f" (raw {'yes' if g['raw_f1'] else 'no'}, PA {'yes' if g['pa_f1'] else 'no'})"
    )
    lines.append(
        "other rows: each detector at the 0.99 level on the same machines; "
        "* bestF1 uses test labels: OPTIMISTIC, not a result"
    )
    return lines + _per_machine(r, 15)


def _per_machine(r: dict, width: int) -> list[str]:
    names = list(r["mean"])
    lines = [
        "per machine, F1 / PA-F1:",
        f"{'machine':14s} " + " ".join(f"{n[:width]:>{width}s}" for n in names),
    ]
    for mach, res in r["per_machine"].items():
        cells = [
            f"{res[n]['point']['f1']:.3f} / {res[n]['point_adjusted']['f1']:.3f}" for n in names
        ]
        lines.append(f"{mach:14s} " + " ".join(f"{c:>{width}s}" for c in cells))
    return lines


def _prediction_table(r: dict) -> list[str]:
    u = r["time_unit"]
    lines = [
        f"{r['dataset']}: predict failure within {r['horizon']} {u}; entities "
        f"fit/val/test {r['entities']['fit']}/{r['entities']['validation']}/"
        f"{r['entities']['test']}; alarm = {r['persist']} consecutive windows",
        f"{'method':27s} {'win-F1':>6s} {'ent-P':>6s} {'ent-R':>6s} {'ent-F1':>6s} "
        f"{'lead':>6s} {'pre-R':>6s} {'pre-F1':>6s} {'sud-R':>6s}",
    ]
    for n, m in r["methods"].items():
        e = m["entity"]
        pre, sud = m.get("precursor_ge_2h", {}), m.get("sudden_death", {})
        lines.append(
            f"{n:27s} {_f(m['window']['f1'])} {_f(e['precision'])} "
            f"{_f(e['recall'])} {_f(e['f1'])} {_f(e['mean_lead'])} "
            f"{_f(pre.get('recall'))} {_f(pre.get('f1'))} {_f(sud.get('recall'))}"
        )
    lines.append(
        f"lead = mean {u} from first alarm to failure over caught entities; "
        "pre = failures with >= 2 h of precursor (+ all healthy); sud = sudden deaths"
    )
    return lines


def _seeds_table(r: dict) -> list[str]:
    lines = [
        f"{r['dataset']}: module-level F1 over seeds {_span(r['seeds'])}",
        f"{'method':27s} {'mean':>6s} {'std':>6s} {'min':>6s} {'max':>6s} {'FA':>5s}",
    ]
    for n, m in r["methods"].items():
        lines.append(
            f"{n:27s} {_f(m['f1_mean'])} {_f(m['f1_std'])} {_f(m['f1_min'])} "
            f"{_f(m['f1_max'])} {int(m['false_alarms']):5d}"
        )
    c = r.get("student_vs_lstm")
    if c:
        g = c["goal"]
        lines.append(
            f"student vs LSTM: {c['wins']} wins, {c['ties']} ties, {c['losses']} "
            f"losses; mean margin {c['mean_margin']:+.3f}; per seed "
            + " ".join(f"{d:+.3f}" for d in c["margin_per_seed"])
        )
        lines.append(
            f"goal (wins >= {seeds.GOAL_WINS:.0%} of seeds, margin >= "
            f"{seeds.GOAL_MARGIN}, no more false alarms): "
            + ("MET" if g["met"] else "NOT MET")
            + " ("
            + ", ".join(f"{k} {'ok' if v else 'no'}" for k, v in g.items() if k != "met")
            + ")"
        )
    lines.append("FA = false alarms (entities), summed over seeds")
    return lines


def _span(xs: list[int]) -> str:
    return f"{xs[0]}-{xs[-1]}" if xs == list(range(xs[0], xs[-1] + 1)) else ",".join(map(str, xs))


class _OneLineErrors(argparse.ArgumentParser):
    """A bad flag is one `Error:` line and exit 2, as bad data is (not argparse's usage)."""

    def error(self, message: str):
        print(f"Error: {message} (see stalwart health eval --help)", file=sys.stderr)
        sys.exit(2)


def main(argv: list[str] | None = None) -> int:
    ap = _OneLineErrors(
        prog="stalwart health eval",
        description=__doc__,
        epilog=fleetcsv.SCHEMA,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--output", "-o", choices=["table", "json"], default="table")
    ap.add_argument(
        "--machines", nargs="*", default=None, help="smd, asd: evaluate only these machines"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--holdout-machines",
        nargs="*",
        default=None,
        metavar="MACHINE",
        help="leave machines out: choose the detector and threshold level on the "
        "other machines, report on these; with no names, each machine in turn",
    )
    ap.add_argument(
        "--seeds",
        default=None,
        help="prediction over several seeds, e.g. 0-9 or 3,5,7-8: mean, spread "
        "and the student's wins against the LSTM",
    )
    ap.add_argument(
        "--horizon",
        type=float,
        default=None,
        help="prediction horizon in the data's time unit (cmapss: 30 cycles; "
        "csv: hours, default 24)",
    )
    ap.add_argument(
        "--poll-interval",
        type=float,
        default=None,
        metavar="HOURS",
        help="csv: the declared poll interval; longer spacings are missed polls "
        "(default: the file's median spacing)",
    )
    ap.add_argument(
        "--time-unit",
        default="h",
        choices=sorted(fleetcsv.TIME_UNITS),
        help="csv: unit of numeric times (h: hours; s or ms: epoch seconds or "
        "milliseconds); ISO 8601 times are always accepted",
    )
    ap.add_argument(
        "--profile",
        choices=fleetcsv.PROFILES,
        default=None,
        help="csv: apply a tuned profile's settings (transceiver: lanes from "
        "NAME_<n> columns, 6 h windows, 6 h teacher shift)",
    )
    ap.add_argument("--no-progress", action="store_true", help="csv: no progress bar on stderr")
    a = ap.parse_args(argv)
    csv_opts = {
        "poll_interval": a.poll_interval,
        "time_unit": a.time_unit,
        "profile": a.profile,
        "progress": not a.no_progress,
    }
    torch.set_num_threads(1)  # the machine is shared: one core per evaluation
    try:
        if a.seeds is not None:
            r = _clean(run_seeds(a.dataset, seeds.parse_seeds(a.seeds), a.horizon, csv_opts))
        else:
            r = _clean(run(a.dataset, a.machines, a.seed, a.horizon, a.holdout_machines, csv_opts))
    except (datasets.DatasetMissing, ValueError) as e:
        print(f"Error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    if a.output == "json":
        print(json.dumps(r))
        return 0
    table = {
        "detection": _detection_table,
        "detection_holdout": _holdout_table,
        "prediction": _prediction_table,
        "prediction_seeds": _seeds_table,
    }[r["task"]]
    print("\n".join(table(r)))
    if "seconds" in r:
        print(f"({r['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
