"""The demo's report: one dict (the JSON), rendered as rich tables and as an HTML page.

Times in the report are seconds since the demo started (``t0``) unless the
key says otherwise; durations end in ``_s``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from stalwart.api import coordinator
from stalwart.demo import timeline

ACCURACY_GOAL = 0.97
# Held-out goal of each built-in the demo trains: (metric, goal, higher is better, text),
# from docs/models.md (char-lm's holds at its default 300 steps; a shorter run falls short).
GOALS: dict[str, tuple[str, float, bool, str]] = {
    "digits-cnn": ("accuracy", ACCURACY_GOAL, True, f"accuracy ≥ {ACCURACY_GOAL:.0%}"),
    "char-lm": ("loss", 2.0, False, "loss ≤ 2.0 nats/byte"),
}
# What the held-out "examples" of each model are.
EXAMPLES = {"digits-cnn": "test images", "char-lm": "held-out bytes"}


def goal(model: str, metrics: dict[str, float]) -> dict:
    """The model's goal as text and whether ``metrics`` meet it (None: no goal)."""
    if model not in GOALS:
        return {"goal": "none set", "goal_met": None}
    metric, value, higher, text = GOALS[model]
    got = metrics[metric]
    return {"goal": text, "goal_met": bool(got >= value if higher else got <= value)}


def build(
    *, config, spec, local, t0, started, result, reference, reference_s, finished, heat=None
) -> dict:
    """``heat``: (heated trainer, heat_from_step, crash_at_step), or None if nobody heated."""
    recoveries = [timeline.recover(f, result.events, spec.steps) for f in result.faults]
    drain = (timeline.health_drain(result.events, *heat, result.heated_alive)
             if heat is not None else None)  # fmt: skip
    if drain is not None:  # seconds since the demo began, as every time in the report
        at = drain.pop("drained_at")
        drain["drained_at_s"] = round(at - t0, 3) if at is not None else None
    audit = timeline.audit_steps(result.events, result.job.job_id, spec.steps)
    if reference is not None:
        equal, differ = bitwise_equal(result.final_params, reference)
    else:
        equal, differ = None, []
    job_state = result.job.state
    report = {
        "run_dir": str(local.run_dir),
        "job": {
            "job_id": result.job.job_id,
            "model": spec.model,
            "model_args": dict(spec.model_args),
            "steps": spec.steps,
            "slots": spec.num_slots,
            "batch_size": spec.batch_size,
            "seed": spec.seed,
            "state": coordinator.JobState.Name(job_state).removeprefix("JOB_STATE_"),
            "reason": result.job.reason,
        },
        "cluster": {
            "coordinators": len(local.of_role("coordinator")),
            "paramservers": len(local.of_role("paramserver")),
            "trainers": config.trainers,
            "standbys": sum(m.started_as == "standby" for m in local.of_role("trainer")),
            "health_service": bool(local.health_address),
            "store_url": local.store_url,
        },
        "health_drain": drain,
        "timings": {
            "cluster_start_s": round(started - t0, 2),
            "training_s": round(result.training_s, 2),
            "reference_s": round(reference_s, 2),
            "total_s": round(finished - t0, 2),
        },
        "faults": [r.to_dict(t0) for r in recoveries],
        # ms per observation of each step phase over the run (docs/performance.md)
        "step_ms": result.step_ms,
        "steps": {
            "final_version": result.final_version,
            **audit.to_dict(),
        },
        "final": {
            "accuracy": round(result.final_metrics["accuracy"], 4),
            "loss": round(result.final_metrics["loss"], 4),
            "test_examples": int(result.final_metrics.get("examples", 0)),
            "examples_are": EXAMPLES.get(spec.model, "held-out examples"),
            **goal(spec.model, result.final_metrics),
        },
        "reference": {
            "computed": reference is not None,
            "bitwise_equal": equal,
            "tensors_differing": differ,
        },
        "samples": [
            {
                "t_s": round(s.time - t0, 3),
                "step": s.step,
                "accuracy": round(s.accuracy, 4),
                "loss": round(s.loss, 5),
            }
            for s in result.samples
        ],  # fmt: skip
        "sampler_errors": result.sampler_errors,
        "events": [
            {
                "t_s": round(e.time - t0, 3),
                "kind": e.kind,
                "node": e.node_id,
                "step": e.step,
                "message": e.message,
            }
            for e in result.events
            if e.kind != "STEP_COMMITTED"
        ],  # fmt: skip
    }
    report["ok"] = bool(
        report["job"]["state"] == "SUCCEEDED"
        and equal is not False
        and result.final_version == spec.steps
        and all(f["recovery_s"] is not None or f["after_end"] for f in report["faults"])
        and (drain is None or drain["ok"])
    )
    return report


def bitwise_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> tuple[bool, list]:
    """(all equal, names that differ); a missing or extra tensor differs."""
    names = sorted(set(got) | set(want))
    differ = [n for n in names if n not in got or n not in want or not torch.equal(got[n], want[n])]
    return not differ, differ


def write(report: dict, run_dir: Path) -> tuple[Path, Path]:
    """report.json and report.html in the run folder."""
    from stalwart.demo import html

    json_path = Path(run_dir) / "report.json"
    json_path.write_text(json.dumps(report, indent=2))
    html_path = Path(run_dir) / "report.html"
    html_path.write_text(html.page(report))
    return json_path, html_path


def _s(value) -> str:
    return "—" if value is None else f"{value:.2f} s"


def render(report: dict, console: Console | None = None) -> None:
    """The report for people: what failed, when it was seen, when training went on."""
    console = console or Console()
    job, final, ref, steps = report["job"], report["final"], report["reference"], report["steps"]
    console.print(
        f"[bold]Stalwart demo[/bold]: {job['model']}, {job['slots']} trainers + "
        f"{report['cluster']['standbys']} standby, {job['steps']} sync steps, seed {job['seed']} "
        f"— job {job['job_id']} {job['state']}"
    )
    table = Table(title="faults (kill -9) and recovery; t = seconds since the demo began")
    for column in ("fault", "killed", "detected", "fix", "resumed", "recovery"):
        table.add_column(column)
    for f in report["faults"]:
        table.add_row(
            f"{f['kind']}\n{f['target']}",
            f"t={f['killed_at_s']:.1f}\nstep {f['step_at_kill']}",
            f"+{_s(f['detection_s'])}\n{_why(f['detected_by'])}",
            _short(_fix(f["action"])),
            ("job had ended" if f["after_end"] else "—") if f["resumed_step"] is None
            else f"step {f['resumed_step']}\n{f['steps_during']} steps meanwhile",
            _s(f["recovery_s"]),
        )  # fmt: skip
    console.print(table)
    _render_drain(report.get("health_drain"), console)
    met = {True: "met", False: "NOT MET", None: "-"}[final["goal_met"]]
    if ref["computed"]:
        lost = "0 (the weights equal the reference)" if ref["bitwise_equal"] else "SOME"
    else:
        lost = "not checked (no reference run)"
    console.print(
        f"final version {steps['final_version']}/{job['steps']}; lost or repeated steps: {lost}; "
        f"STEP_COMMITTED announced for {steps['committed']} steps "
        f"({len(steps['missing'])} not announced, {len(steps['repeated'])} twice)"
    )
    console.print(
        f"final held-out accuracy: [bold]{final['accuracy']:.2%}[/bold], loss "
        f"[bold]{final['loss']:.4f}[/bold] on {final['test_examples']} {final['examples_are']} "
        f"(goal {final['goal']}: {met})"
    )
    if ref["computed"]:
        verdict = (
            "[bold green]yes[/bold green]"
            if ref["bitwise_equal"]
            else f"[bold red]NO[/bold red] ({', '.join(ref['tensors_differing'][:5])})"
        )
        console.print(f"final weights bitwise equal to a fault-free reference run: {verdict}")
    t = report["timings"]
    console.print(
        f"time: cluster start {t['cluster_start_s']:.1f} s, training {t['training_s']:.1f} s, "
        f"reference {t['reference_s']:.1f} s, total {t['total_s']:.1f} s"
    )
    if report.get("html"):
        console.print(f"report: {report['html']}  (JSON: {report['json']})")


def _render_drain(drain: dict | None, console: Console) -> None:
    if drain is None:
        return
    head = (f"health: {drain['node']} heated from step {drain['heat_from_step']}, "
            f"scripted to die at step {drain['crash_at_step']}: ")  # fmt: skip
    if not drain["drained"]:
        console.print(head + "[bold red]not drained[/bold red]"
                      + (" (it died)" if drain["crash_fired"] else ""))  # fmt: skip
        return
    verdict = "[bold green]before its death[/bold green]" if drain["ok"] else "[bold red]too late"
    console.print(f"{head}drained after step {drain['drained_at_step']}, {verdict}"
                  f"{'' if drain['crash_fired'] else '; the death never came'}\n"
                  f"  event NODE_DRAINED: {drain['reason']}")  # fmt: skip


def _why(detected_by: str) -> str:
    """'trainer t-1 dead: lease expired' -> 'lease expired'."""
    return detected_by.rsplit(": ", 1)[-1] if ": " in detected_by else detected_by


def _fix(action: str) -> str:
    if "standby promoted" in action:
        return action.split(" of ")[0].replace(" standby promoted into", " took")
    if "promoted to primary" in action:
        return (
            action.removeprefix("paramserver ")
            .split(" of ")[0]
            .replace(" promoted to primary", " now primary")
        )
    return action


def _short(text: str, width: int = 34) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
