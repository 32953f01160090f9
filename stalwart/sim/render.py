"""Self-contained HTML with inline SVG: ETTR and effective throughput against N, one line
per strategy, the sensitivity sweeps and the inputs used. No JavaScript, no external files."""

from __future__ import annotations

import html
import json
import math

COLORS = {"restart-all": "#c0392b", "torchft": "#e67e22", "stalwart": "#2471a3",
          "stalwart+drain": "#17a589", "restart-all ": "#c0392b"}  # fmt: skip
W, H, PAD_L, PAD_R, PAD_T, PAD_B = 460, 300, 56, 130, 34, 44


def _esc(text) -> str:
    return html.escape(str(text))


DASHED = {"stalwart+drain"}  # drawn dashed on top: it often lies on the plain stalwart line


def _nice_range(lo: float, hi: float) -> tuple[float, float, float]:
    """Round the y range out to a tick step of 1, 2 or 5 x 10^k, at most 7 ticks."""
    span = max(hi - lo, 1e-3)
    for step in (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.25, 0.5, 1.0):
        if span / step <= 6:
            break
    return math.floor(lo / step) * step, math.ceil(hi / step) * step, step


def _chart(title: str, series: dict[str, list[tuple[float, float]]], xlabel: str, ylabel: str,
           log_x: bool = False, y_range: tuple[float, float] | None = None,
           percent: bool = True, x_names: dict[float, str] | None = None) -> str:  # fmt: skip
    xs = [x for pts in series.values() for x, _ in pts]
    ys = [y for pts in series.values() for _, y in pts]
    fx = (lambda v: math.log10(max(v, 1e-9))) if log_x else (lambda v: v)
    x0, x1 = fx(min(xs)), fx(max(xs))
    y0, y1, step = _nice_range(*(y_range or (min(ys), min(1.0, max(ys)))))
    x1 = x1 if x1 > x0 else x0 + 1
    pw, ph = W - PAD_L - PAD_R, H - PAD_T - PAD_B

    def px(v):
        return PAD_L + (fx(v) - x0) / (x1 - x0) * pw

    def py(v):
        return PAD_T + (1 - (v - y0) / (y1 - y0)) * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'font-family="sans-serif" font-size="11">',
           f'<text x="{W / 2 - PAD_R / 2}" y="18" text-anchor="middle" font-size="13" '
           f'font-weight="bold">{_esc(title)}</text>']  # fmt: skip
    for i in range(round((y1 - y0) / step) + 1):
        v = y0 + step * i
        label = (f"{v:.0%}" if step >= 0.01 else f"{v:.1%}") if percent else f"{v:g}"
        out.append(f'<line x1="{PAD_L}" x2="{PAD_L + pw}" y1="{py(v):.1f}" y2="{py(v):.1f}" '
                   f'stroke="#ddd"/><text x="{PAD_L - 6}" y="{py(v) + 4:.1f}" '
                   f'text-anchor="end">{label}</text>')  # fmt: skip
    for x in sorted(set(xs)):
        out.append(f'<text x="{px(x):.1f}" y="{PAD_T + ph + 16}" text-anchor="middle">'
                   f'{(x_names or {}).get(x, f"{x:,g}")}</text><line x1="{px(x):.1f}" x2="{px(x):.1f}" y1="{PAD_T}" '
                   f'y2="{PAD_T + ph}" stroke="#eee"/>')  # fmt: skip
    out.append(f'<text x="{PAD_L + pw / 2}" y="{H - 6}" text-anchor="middle">{_esc(xlabel)}</text>')
    out.append(
        f'<text transform="translate(14,{PAD_T + ph / 2}) rotate(-90)" '
        f'text-anchor="middle">{_esc(ylabel)}</text>'
    )
    for k, (name, pts) in enumerate(series.items()):
        color = COLORS.get(name, ["#7d3c98", "#566573", "#b7950b"][k % 3])
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        dash = ' stroke-dasharray="7,5"' if name in DASHED else ""
        width = 2 if name in DASHED else 3.5
        out.append(
            f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="{width}"{dash}/>'
        )
        for x, y in pts:
            out.append(
                f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3.5" fill="{color}">'
                f"<title>{_esc(name)}: {y:.2%} at {x:,g}</title></circle>"
            )
        ly = PAD_T + 14 + k * 18
        out.append(f'<line x1="{W - PAD_R + 10}" x2="{W - PAD_R + 30}" y1="{ly}" y2="{ly}" '
                   f'stroke="{color}" stroke-width="3"{dash}/><text x="{W - PAD_R + 35}" y="{ly + 4}">'
                   f'{_esc(name)}</text>')  # fmt: skip
    out.append("</svg>")
    return "".join(out)


def _by_strategy(rows: list[dict], key: str) -> dict[str, list[tuple[float, float]]]:
    series: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        series.setdefault(r["strategy"], []).append((r["gpus"], r[key]))
    return series


def _table(headers: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{_esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def result_rows(rows: list[dict]) -> list[list]:
    return [[f"{r['gpus']:,}", r["strategy"], f"{r['ettr']:.2%}",
             f"{r['ettr_min']:.2%}–{r['ettr_max']:.2%}", f"{r['throughput_ratio']:.2f}",
             f"{r['effective_throughput']:.2%}", f"{r['mtbf_h']:.2f}",
             f"{r['checkpoint_interval_s']:,.0f}"] for r in rows]  # fmt: skip


RESULT_HEADERS = ["GPUs", "strategy", "ETTR", "ETTR seeds", "thr. ratio", "eff. thr.",
                  "MTBF h", "ckpt every s"]  # fmt: skip


def html_report(doc: dict) -> str:
    rows = doc["results"]
    charts = [
        _chart("ETTR", _by_strategy(rows, "ettr"), "GPUs (log scale)", "ETTR", log_x=True),
        _chart("Effective throughput (ETTR × throughput vs DDP)",
               _by_strategy(rows, "effective_throughput"), "GPUs (log scale)",
               "of a failure-free DDP run", log_x=True, y_range=(0.0, 1.0)),
    ]  # fmt: skip
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>Stalwart: ETTR at scale"
             "</title><style>body{font-family:sans-serif;margin:24px;max-width:1000px;color:#222}"
             "table{border-collapse:collapse;margin:8px 0 18px;font-size:13px}"
             "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
             "th{background:#f3f3f3}svg{margin:4px 12px 4px 0}pre{font-size:11px;"
             "background:#f7f7f7;padding:8px;overflow-x:auto}</style></head><body>",
             "<h1>One training job on N GPUs: ETTR and effective throughput per strategy</h1>",
             f"<p>{_esc(doc['summary'])}</p>", "".join(charts),
             "<p>Effective throughput = ETTR × the strategy's throughput against a plain DDP "
             "run: 1 for restart-all, assumed 1 for torchft, our measured ratio for Stalwart "
             "(inputs below). Stalwart's dashed line is the same with predictive drain.</p>",
             _table(RESULT_HEADERS, result_rows(rows))]  # fmt: skip
    if doc.get("anchors"):
        parts.append("<h2>Sanity against published results</h2>")
        parts.append(
            _table(
                ["anchor", "GPUs", "published", "simulated ETTR", "source"],
                [
                    [
                        a["anchor"],
                        f"{a['gpus']:,}",
                        a["published"],
                        f"{a['simulated_ettr']:.2%}",
                        a["source"],
                    ]
                    for a in doc["anchors"]
                ],
            )
        )
    if doc.get("sensitivity"):
        parts.append(_sensitivity(doc["sensitivity"]))
    parts.append("<h2>Inputs</h2><pre>" + _esc(json.dumps(doc["inputs"], indent=1)) + "</pre>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _sensitivity(s: dict) -> str:
    n = f"{s['gpus']:,} GPUs"
    pool = s["pool_size_refill_by_repair"]
    interval: dict[str, list[tuple[float, float]]] = {}
    for r in s["checkpoint_interval_vs_young_daly"]:
        interval.setdefault(r["strategy"], []).append((r["scale"], r["ettr"]))
    recall = s["predictor_recall"]
    return "".join([
        f"<h2>Sensitivity at {n}</h2>",
        _chart("Standby pool (refilled by repair)",
               {"stalwart": [(max(r["standbys"], 0.5), r["ettr"]) for r in pool]},
               "standby nodes (log)", "ETTR", log_x=True, x_names={0.5: "0"}),
        _chart("Checkpoint interval", interval, "× Young–Daly interval (log)", "ETTR", log_x=True),
        _chart("Predictor recall (drain on)",
               {"stalwart+drain": [(r["recall"], r["ettr"]) for r in recall]},
               "recall on failures with a precursor", "ETTR"),
    ])  # fmt: skip
