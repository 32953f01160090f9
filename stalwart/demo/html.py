"""The demo report as one self-contained HTML page (inline SVG, no scripts, no network)."""

from __future__ import annotations

import json
from html import escape

from stalwart.demo.svg import COLORS, Marker, Span, line_chart, step_phases_chart, timeline_chart

_STYLE = """
body { font-family: sans-serif; margin: 24px auto; max-width: 1180px; color: #222; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 28px; }
table { border-collapse: collapse; font-size: 13px; }
td, th { border: 1px solid #ccc; padding: 4px 8px; text-align: left; }
th { background: #f0f0f0; }
.ok { color: #2ca02c; font-weight: bold; } .bad { color: #d62728; font-weight: bold; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; }
details pre { font-size: 11px; max-height: 400px; overflow: auto; background: #f7f7f7; }
"""


def _markers(report: dict, by: str) -> list[Marker]:
    out = []
    for f in report["faults"]:
        color = COLORS.get(f["kind"], "#000")
        if by == "step":
            out.append(Marker(f["step_at_kill"], f"kill {f['kind']}", color))
        else:
            out.append(Marker(f["killed_at_s"], f"kill {f['kind']}", color))
            if f["resumed_at_s"] is not None:
                out.append(Marker(f["resumed_at_s"], "", "#2ca02c", dashed=True))
    return out


def _charts(report: dict) -> str:
    samples = report["samples"]
    charts = []
    for metric, label, y_range in (("accuracy", "held-out accuracy", (0.0, 1.0)),
                                   ("loss", "held-out loss", None)):  # fmt: skip
        for by, x_label in (("step", "step"), ("t_s", "wall time since start (s)")):
            points = [(s[by], s[metric]) for s in samples]
            charts.append(
                line_chart(
                    points, title=f"{label} vs {'step' if by == 'step' else 'wall time'}",
                    x_label=x_label, y_label=label, y_range=y_range,
                    markers=_markers(report, "step" if by == "step" else "time"),
                )
            )  # fmt: skip
    return '<div class="charts">' + "".join(charts) + "</div>"


def _step_phases(report: dict) -> str:
    """The step timeline (docs/performance.md, "Step timeline"), when it was scraped."""
    step_ms = report.get("step_ms") or {}
    if not step_ms:
        return ""
    return ("<h2>Step timeline</h2><p>Mean milliseconds per observation of each phase, "
            "from the trainers' and the paramservers' own metrics over the whole run, "
            "faults included (<code>stalwart bench ddp</code> measures a fault-free "
            f"window).</p><p>{step_phases_chart(step_ms)}</p>")  # fmt: skip


def _fault_rows(report: dict) -> str:
    def s(v):
        return "—" if v is None else f"{v:.2f}"

    rows = []
    for f in report["faults"]:
        rows.append(
            "<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in (
                f"{f['kind']} ({f['target']})", s(f["killed_at_s"]), f["step_at_kill"],
                s(f["detection_s"]), f["detected_by"], f["action"], s(f["recovery_s"]),
                f["resumed_step"], f["steps_during"],
            )) + "</tr>"
        )  # fmt: skip
    head = "".join(f"<th>{h}</th>" for h in (
        "fault", "killed at (s)", "step", "detected after (s)", "detected by", "fix",
        "next step after (s)", "resumed at step", "steps during"))  # fmt: skip
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def page(report: dict) -> str:
    job, final, ref, steps = report["job"], report["final"], report["reference"], report["steps"]
    spans = [
        Span(f"{f['kind']} {f['target']}", f["kind"], f["detection_s"],
             None if f["acted_at_s"] is None else f["acted_at_s"] - f["killed_at_s"],
             f["recovery_s"])
        for f in report["faults"]
    ]  # fmt: skip
    if ref["computed"]:
        equal = ref["bitwise_equal"]
        verdict = ('<span class="ok">yes</span>' if equal
                   else f'<span class="bad">NO</span> {escape(", ".join(ref["tensors_differing"]))}')  # fmt: skip
    else:
        verdict = "not computed"
    acc_cls = {True: "ok", False: "bad", None: ""}[final["goal_met"]]
    t = report["timings"]
    summary = f"""
<table>
<tr><th>job</th><td>{escape(job['job_id'])}: {escape(job['model'])}, {job['slots']} slots,
 {job['steps']} sync steps, batch {job['batch_size']}, seed {job['seed']} — {escape(job['state'])}</td></tr>
<tr><th>cluster</th><td>{report['cluster']['coordinators']} coordinators,
 {report['cluster']['paramservers']} paramservers, {report['cluster']['trainers']} trainers +
 {report['cluster']['standbys']} standby, store {escape(report['cluster']['store_url'])}</td></tr>
<tr><th>final held-out accuracy</th><td class="{acc_cls}">{final['accuracy']:.2%}, loss {final['loss']:.4f}
 ({final['test_examples']} {escape(final['examples_are'])}; goal {escape(final['goal'])})</td></tr>
<tr><th>bitwise equal to a fault-free run</th><td>{verdict}</td></tr>
<tr><th>steps</th><td>final version {steps['final_version']}/{job['steps']};
 STEP_COMMITTED announced for {steps['committed']} ({len(steps['missing'])} not announced,
 {len(steps['repeated'])} twice; announcements are at most once, a leader change can skip some)</td></tr>
<tr><th>time</th><td>cluster start {t['cluster_start_s']:.1f} s, training {t['training_s']:.1f} s,
 reference {t['reference_s']:.1f} s, total {t['total_s']:.1f} s</td></tr>
</table>"""  # fmt: skip
    events = "".join(
        f"<tr><td>{e['t_s']:.2f}</td><td>{escape(e['kind'])}</td><td>{escape(e['message'])}</td></tr>"
        for e in report["events"]
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Stalwart demo — {escape(job["job_id"])}</title>
<style>{_STYLE}</style></head><body>
<h1>Stalwart demo: training through kill -9 of a trainer, the paramserver primary and the
coordinator leader</h1>
{summary}
<h2>Faults and recovery</h2>
{_fault_rows(report)}
<p>{timeline_chart(spans)}</p>
{_step_phases(report)}
<h2>Training curves (faults marked)</h2>
{_charts(report)}
<h2>Cluster events (steps omitted)</h2>
<table><tr><th>t (s)</th><th>kind</th><th>message</th></tr>{events}</table>
<details><summary>report JSON</summary><pre>{escape(json.dumps(report, indent=2))}</pre></details>
</body></html>
"""
