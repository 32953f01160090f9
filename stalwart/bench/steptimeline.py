"""The step timeline: milliseconds per sync step, by phase, from the services' own metrics.

Trainers record ``stalwart_trainer_step_phase_seconds{phase}`` and paramservers
``stalwart_paramserver_push_phase_seconds{phase}`` (services/*/phases.py).
:func:`scrape` reads every live trainer's and paramserver's ``/metrics`` at the
start and end of a window; :func:`per_step_ms` turns the differences into the
mean of each phase over the window's observations (one per slot and step for
trainer phases and ``receive``/``wait_slots``/``answer``, one per step for ``apply``,
``replicate`` and ``commit`` on the primary; backups record none of these).
"""

from __future__ import annotations

import asyncio
import statistics
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

FAMILIES = {
    "stalwart_trainer_step_phase_seconds": "trainer",
    "stalwart_paramserver_push_phase_seconds": "paramserver",
}
# The order a step's time is printed in: the trainer's view, then inside its push.
ORDER = ("trainer.pull", "trainer.load", "trainer.compute", "trainer.push",
         "paramserver.receive", "paramserver.wait_slots", "paramserver.commit",
         "paramserver.apply", "paramserver.replicate", "paramserver.answer")  # fmt: skip


def parse(text: str) -> dict[str, list[float]]:
    """``{"role.phase": [sum seconds, count]}`` from one /metrics page."""
    out: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        role = FAMILIES.get(family.name)
        if role is None:
            continue
        for sample in family.samples:
            key = f"{role}.{sample.labels.get('phase', '')}"
            slot = out.setdefault(key, [0.0, 0.0])
            if sample.name.endswith("_sum"):
                slot[0] += sample.value
            elif sample.name.endswith("_count"):
                slot[1] += sample.value
    return out


def fetch_metrics(port: int) -> str:
    """The /metrics page a service serves on ``port`` (loopback)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        return resp.read().decode()


async def scrape(local, spec=None) -> dict[str, list[float]]:
    """Summed phase sums and counts over every live trainer and paramserver of ``local``."""
    ports = [p.metrics_port for name, p in local.procs.items()
             if p.metrics_port and p.alive() and local.member(name).role != "coordinator"]  # fmt: skip
    pages = await asyncio.gather(*(asyncio.to_thread(fetch_metrics, port) for port in ports),
                                 return_exceptions=True)  # fmt: skip
    total: dict[str, list[float]] = {}
    for page in pages:
        if isinstance(page, BaseException):
            continue  # a process that just died: the window loses its share
        for key, (s, c) in parse(page).items():
            slot = total.setdefault(key, [0.0, 0.0])
            slot[0] += s
            slot[1] += c
    return total


def per_step_ms(before: dict, after: dict) -> dict[str, float]:
    """Mean milliseconds per observation of each phase between two scrapes."""
    out = {}
    for key in ORDER:
        s0, c0 = before.get(key, (0.0, 0.0))
        s1, c1 = after.get(key, (0.0, 0.0))
        if c1 > c0:
            out[key] = round(1000 * (s1 - s0) / (c1 - c0), 2)
    return out


def median_phases(rows: list[dict[str, float]]) -> dict[str, float]:
    keys = [k for k in ORDER if any(k in r for r in rows)]
    return {k: round(statistics.median(r[k] for r in rows if k in r), 2) for k in keys}
