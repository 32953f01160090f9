"""Tiny inline-SVG charts for the demo page: line charts with marked moments, and a timeline.

Hand-made so the page needs no plotting library and no network: each function
returns one ``<svg>`` string with its own axes, ticks and labels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

COLORS = {"trainer": "#d62728", "paramserver": "#9467bd", "coordinator": "#ff7f0e"}
LINE = "#1f77b4"


@dataclass(frozen=True)
class Marker:
    x: float
    label: str
    color: str
    dashed: bool = False


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values covering [lo, hi]."""
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [round(first + i * step, 10) for i in range(int((hi - first) / step) + 1)]


def _fmt(v: float) -> str:
    return f"{v:g}" if abs(v) >= 0.01 or v == 0 else f"{v:.1e}"


def _opening(width: int, height: int, title: str) -> list[str]:
    """A chart's ``<svg>`` tag and its bold centred title: the start of its parts."""
    return [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
            f'<text x="{width / 2}" y="16" text-anchor="middle" font-size="13" '
            f'font-weight="bold">{escape(title)}</text>']  # fmt: skip


def line_chart(
    points: Sequence[tuple[float, float]],
    *,
    title: str,
    x_label: str,
    y_label: str,
    markers: Sequence[Marker] = (),
    y_range: tuple[float, float] | None = None,
    width: int = 560,
    height: int = 300,
) -> str:
    left, right, top, bottom = 58, 16, 30, 44
    pw, ph = width - left - right, height - top - bottom
    xs = [p[0] for p in points] + [m.x for m in markers] or [0.0, 1.0]
    ys = [p[1] for p in points] or [0.0, 1.0]
    x0, x1 = min(xs), max(xs)
    y0, y1 = y_range or (min(ys), max(ys))
    if x1 <= x0:
        x1 = x0 + 1
    if y1 <= y0:
        y1 = y0 + 1

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return top + ph - (y - y0) / (y1 - y0) * ph

    out = [*_opening(width, height, title),
           f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="#fafafa" '
           f'stroke="#999"/>']  # fmt: skip
    for t in nice_ticks(x0, x1):
        if x0 <= t <= x1:
            out.append(f'<line x1="{sx(t):.1f}" y1="{top + ph}" x2="{sx(t):.1f}" '
                       f'y2="{top + ph + 4}" stroke="#666"/><text x="{sx(t):.1f}" '
                       f'y="{top + ph + 16}" text-anchor="middle">{_fmt(t)}</text>')  # fmt: skip
    for t in nice_ticks(y0, y1):
        if y0 <= t <= y1:
            out.append(f'<line x1="{left}" y1="{sy(t):.1f}" x2="{left + pw}" y2="{sy(t):.1f}" '
                       f'stroke="#e4e4e4"/><text x="{left - 6}" y="{sy(t) + 4:.1f}" '
                       f'text-anchor="end">{_fmt(t)}</text>')  # fmt: skip
    out.append(f'<text x="{left + pw / 2}" y="{height - 8}" text-anchor="middle">'
               f'{escape(x_label)}</text><text x="14" y="{top + ph / 2}" text-anchor="middle" '
               f'transform="rotate(-90 14 {top + ph / 2})">{escape(y_label)}</text>')  # fmt: skip
    for i, m in enumerate(markers):
        dash = ' stroke-dasharray="4 3"' if m.dashed else ""
        out.append(f'<line x1="{sx(m.x):.1f}" y1="{top}" x2="{sx(m.x):.1f}" y2="{top + ph}" '
                   f'stroke="{m.color}" stroke-width="1.5"{dash}><title>{escape(m.label)}'
                   f'</title></line>')  # fmt: skip
        if m.label:
            out.append(f'<text x="{sx(m.x) + 3:.1f}" y="{top + 12 + 12 * (i % 3)}" '
                       f'fill="{m.color}">{escape(m.label)}</text>')  # fmt: skip
    if points:
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in points)
        out.append(f'<polyline points="{path}" fill="none" stroke="{LINE}" stroke-width="1.8"/>')
    out.append("</svg>")
    return "".join(out)


@dataclass(frozen=True)
class Span:
    """One recovery on the timeline: kill at 0, then detection, action, resume (seconds)."""

    label: str
    kind: str
    detected: float | None
    acted: float | None
    resumed: float | None


def timeline_chart(spans: Sequence[Span], width: int = 720) -> str:
    """One row per fault: bars from the kill to detection, to the action, to the resume."""
    row, left, right, top = 34, 200, 24, 40
    height = top + row * max(1, len(spans)) + 40
    ends = [v for s in spans for v in (s.detected, s.acted, s.resumed) if v is not None]
    x1 = max(ends + [1.0]) * 1.1
    pw = width - left - right

    def sx(v: float) -> float:
        return left + v / x1 * pw

    out = _opening(width, height, "Recovery timeline (seconds after each kill -9)")
    for t in nice_ticks(0, x1):
        if t <= x1:
            out.append(f'<line x1="{sx(t):.1f}" y1="{top - 6}" x2="{sx(t):.1f}" '
                       f'y2="{height - 34}" stroke="#e4e4e4"/><text x="{sx(t):.1f}" '
                       f'y="{height - 20}" text-anchor="middle">{_fmt(t)} s</text>')  # fmt: skip
    phases = (("detected", "#bbb", "until detected"), ("acted", "#888", "until the fix"),
              ("resumed", "#2ca02c", "until the next step"))  # fmt: skip
    for i, s in enumerate(spans):
        y = top + i * row
        out.append(f'<text x="{left - 8}" y="{y + 16}" text-anchor="end">{escape(s.label)}</text>')
        start = 0.0
        for attr, color, what in phases:
            end = getattr(s, attr)
            if end is None:
                continue
            out.append(f'<rect x="{sx(start):.1f}" y="{y + 4}" width="{max(1.0, sx(end) - sx(start)):.1f}" '
                       f'height="18" fill="{color}"><title>{escape(s.label)}: {what} '
                       f'{end:.3f} s</title></rect>')  # fmt: skip
            start = max(start, end)
        out.append(f'<line x1="{sx(0):.1f}" y1="{y + 1}" x2="{sx(0):.1f}" y2="{y + 25}" '
                   f'stroke="{COLORS.get(s.kind, "#000")}" stroke-width="3"/>')  # fmt: skip
        if s.resumed is not None:
            out.append(f'<text x="{sx(s.resumed) + 4:.1f}" y="{y + 17}">{s.resumed:.2f} s</text>')
    legend_y = height - 6
    out.append(f'<text x="{left}" y="{legend_y}" fill="#666">grey: until detected · dark grey: '
               f'until the fix (standby / backup promoted, leader elected) · green: until the '
               f'next committed step</text>')  # fmt: skip
    out.append("</svg>")
    return "".join(out)


def step_phases_chart(step_ms: dict[str, float], width: int = 560) -> str:
    """One bar per phase of the step timeline (``stalwart.bench.steptimeline``), in the
    order given: milliseconds per observation. The paramserver's phases happen inside
    the trainer's push, so the bars are not stacked."""
    row, left, right, top = 24, 170, 60, 30
    height = top + row * len(step_ms) + 26
    x1 = max(step_ms.values(), default=1.0) or 1.0
    pw = width - left - right

    def sx(v: float) -> float:
        return left + v / x1 * pw

    out = _opening(width, height, "Where a synchronous step goes (ms per observation)")
    for i, (phase, ms) in enumerate(step_ms.items()):
        y = top + i * row
        role = phase.partition(".")[0]
        out.append(f'<text x="{left - 8}" y="{y + 15}" text-anchor="end">{escape(phase)}</text>'
                   f'<rect x="{left}" y="{y + 3}" width="{max(1.0, sx(ms) - left):.1f}" height="16" '
                   f'fill="{COLORS.get(role, LINE)}"><title>{escape(phase)}: {ms:.2f} ms</title></rect>'
                   f'<text x="{sx(ms) + 4:.1f}" y="{y + 15}">{ms:.2f}</text>')  # fmt: skip
    out.append(f'<text x="{left}" y="{height - 6}" fill="#666">trainer phases in red, the '
               f'paramserver primary\'s (inside the push) in purple</text>')  # fmt: skip
    out.append("</svg>")
    return "".join(out)
