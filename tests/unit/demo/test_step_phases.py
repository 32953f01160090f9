"""The demo page's step timeline: one bar per phase, none when nothing was scraped."""

from __future__ import annotations

import re

from stalwart.demo import html, svg

STEP_MS = {"trainer.compute": 4.0, "trainer.push": 12.0, "paramserver.commit": 3.5}


def test_one_bar_per_phase_scaled_to_the_longest():
    chart = svg.step_phases_chart(STEP_MS, width=560)
    bars = re.findall(r'<rect x="170" y="[\d.]+" width="([\d.]+)" height="16" fill="([^"]+)">'
                      r"<title>([^:]+): ([\d.]+) ms</title>", chart)  # fmt: skip
    assert [(b[2], float(b[3])) for b in bars] == list(STEP_MS.items())
    widths = {b[2]: float(b[0]) for b in bars}
    assert widths["trainer.push"] == 560 - 170 - 60  # the longest spans the plot
    assert widths["trainer.compute"] == round((560 - 230) * 4.0 / 12.0, 1)
    assert {b[1] for b in bars if b[2].startswith("trainer.")} == {svg.COLORS["trainer"]}
    assert [b[1] for b in bars if b[2].startswith("paramserver.")] == [svg.COLORS["paramserver"]]


def test_the_page_draws_it_only_when_scraped():
    assert html._step_phases({"step_ms": {}}) == ""
    assert html._step_phases({}) == ""
    section = html._step_phases({"step_ms": STEP_MS})
    assert section.startswith("<h2>Step timeline</h2>") and "paramserver.commit" in section
