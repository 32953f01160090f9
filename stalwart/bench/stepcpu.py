"""CPU per synchronous step, per process of the cluster, for ``bench ddp``'s workload.

``python -m stalwart.bench.stepcpu [STEPS] [STANDBYS]`` starts the default local
cluster (3 trainers, STANDBYS warm standbys, default 1), runs one fault-free job of
STEPS steps (default 400) and prints one JSON object: wall milliseconds per step,
and for every member the CPU milliseconds (user + system, from /proc) it spent per
step between the job's step 50 and its last, with the gRPC calls each server
started per step (from its /metrics). On a 2-core machine the sum over members,
divided by the wall time of a step, says how close the job is to using both cores:
when it is, a step gets faster only by taking CPU out of some process, and these
figures say which. The services run the code of the checkout this module is
imported from (``cluster`` starts them from its repository root): to compare two
checkouts, run it in each with ``PYTHONPATH`` set to that checkout.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

from prometheus_client.parser import text_string_to_metric_families

from stalwart import cluster
from stalwart.bench import ddp, steptimeline
from stalwart.client.coordinator import CoordinatorClient
from stalwart.demo.watch import EventRecorder
from stalwart.procs import stat_fields

WARMUP = 50
_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(stat_line: str) -> float:
    """User + system seconds from a ``/proc/<pid>/stat`` line (fields 14 and 15)."""
    fields = stat_fields(stat_line)
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _process_cpu(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return cpu_seconds(f.read())
    except OSError:
        return None  # gone


def _calls_started(port: int) -> dict[str, float]:
    """``{method: calls started}`` from one server's /metrics page."""
    text = steptimeline.fetch_metrics(port)
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "grpc_server_started":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    out[sample.labels["grpc_method"]] = sample.value
    return out


def _snapshot(local) -> dict[str, tuple[float | None, dict[str, float]]]:
    out = {}
    for m in local.members:
        proc = local.procs.get(m.name)
        calls = _calls_started(proc.metrics_port) if proc and proc.metrics_port else {}
        out[m.name] = (_process_cpu(m.pid), calls)
    return out


def per_step(before: dict, after: dict, steps: int) -> dict[str, dict]:
    """Each member's CPU ms and calls started per step between two snapshots."""
    out = {}
    for name, (cpu0, calls0) in before.items():
        cpu1, calls1 = after.get(name, (None, {}))
        if cpu0 is None or cpu1 is None:
            continue
        calls = {k: round((v - calls0.get(k, 0.0)) / steps, 2) for k, v in calls1.items()}
        out[name] = {
            "cpu_ms": round((cpu1 - cpu0) * 1000 / steps, 2),
            "calls": {k: v for k, v in sorted(calls.items()) if v >= 0.01},
        }
    return out


async def _reach(recorder: EventRecorder, step: int) -> None:
    if not await recorder.wait_step(step, 900):
        raise TimeoutError(f"job at step {recorder.step}, waiting for step {step}")


async def _measure(local, spec) -> dict:
    async with CoordinatorClient(local.coordinator_addresses, retry_for_s=30.0) as client:
        job = await client.create_job(spec)
        recorder = EventRecorder(client, job.job_id)
        watch = asyncio.create_task(recorder.run())
        try:
            await _reach(recorder, WARMUP)
            before, started = await asyncio.to_thread(_snapshot, local), time.time()
            await _reach(recorder, spec.steps)
            after, ended = await asyncio.to_thread(_snapshot, local), time.time()
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
    steps = spec.steps - WARMUP
    members = per_step(before, after, steps)
    wall_ms = (ended - started) * 1000 / steps
    total = sum(m["cpu_ms"] for m in members.values())
    return {
        "wall_ms_per_step": round(wall_ms, 2),
        "cpu_ms_per_step": round(total, 2),
        "cores_busy": round(total / wall_ms, 2),
        "members": members,
        "load_average_1m": round(os.getloadavg()[0], 1),
    }


def main(steps: int = 400, standbys: int = 1) -> None:
    if steps <= WARMUP:
        raise SystemExit(f"Error: STEPS must be above {WARMUP}")
    spec = ddp.workload(steps)
    local = cluster.start(
        cluster.ClusterConfig(trainers=3, standbys=standbys, launcher=True, stop_with_caller=True)
    )
    try:
        asyncio.run(cluster.wait_healthy(local, 300))
        print(json.dumps(asyncio.run(_measure(local, spec))), flush=True)
    finally:
        local.stop(timeout_s=10)


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
