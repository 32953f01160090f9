"""Start-up figures of a local cluster (docs/performance.md, "Start-up").

    .venv/bin/python scripts/startup_figures.py [--trainers 2] [--no-preload]

1. ``stalwart up --standbys 0`` as a subprocess: seconds from its start until it returns
   (everything serving and registered with the leader);
2. a digits-cnn job on every trainer; at step 5 ``kill -9`` of ``trainer-1``'s process
   group: seconds until the job's step moves on (nothing restarts a trainer in
   ``stalwart up``; the dead trainer's slot spills onto the survivors, elastic slots);
3. a stand-in for it (``LocalCluster.replace``, from the state file, as a later
   command would): seconds until it serves and seconds until the leader lists it alive;
4. ``stalwart down``: seconds, and whether any process of the run is left.

Prints one JSON object. The load average is read before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from stalwart import cluster
from stalwart.api import coordinator
from stalwart.client.coordinator import CoordinatorClient

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stalwart.cli.main", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, check=False)  # fmt: skip


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


async def kill_and_replace(run_dir: Path, trainers: int) -> dict:
    local = cluster.load(run_dir)
    out: dict = {}
    async with CoordinatorClient(local.coordinator_addresses) as client:
        spec = coordinator.JobSpec(model="digits-cnn", num_slots=trainers, steps=100_000,
                                   batch_size=16, seed=0)  # fmt: skip
        job = await client.create_job(spec)
        while (job := await client.get_job(job.job_id)).step < 5:
            await asyncio.sleep(0.02)
        victim = local.member("trainer-1")
        step = job.step
        killed = time.monotonic()
        os.killpg(victim.pid, signal.SIGKILL)
        while (now := (await client.get_job(job.job_id)).step) <= step:
            await asyncio.sleep(0.01)
        out["kill_to_next_step_s"] = round(time.monotonic() - killed, 3)
        while now <= step + 1:  # the first step the dead trainer cannot have pushed for
            await asyncio.sleep(0.01)
            now = (await client.get_job(job.job_id)).step
        out["kill_to_second_step_s"] = round(time.monotonic() - killed, 3)
        while local.alive("trainer-1"):
            await asyncio.sleep(0.01)
        started = time.monotonic()
        member = await asyncio.to_thread(local.replace, "trainer-1")
        out["replacement_serving_s"] = round(time.monotonic() - started, 3)
        while True:
            nodes = await client.all_nodes()
            if any(n.node_id == member.name and n.state == coordinator.NODE_STATE_ALIVE
                   for n in nodes):  # fmt: skip
                break
            await asyncio.sleep(0.01)
        out["replacement_registered_s"] = round(time.monotonic() - started, 3)
        await client.cancel_job(job.job_id, "start-up figures done")
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trainers", type=int, default=2)
    parser.add_argument("--runs-root", default="/tmp/startup-runs")
    parser.add_argument("--no-preload", action="store_true", help="stalwart up --no-preload")
    opts = parser.parse_args()
    figures: dict = {"preload": not opts.no_preload, "load_before": load()}
    started = time.monotonic()
    up = cli("up", "--trainers", str(opts.trainers), "--standbys", "0",
             "--runs-root", opts.runs_root, "-o", "json",
             *(["--no-preload"] if opts.no_preload else []))  # fmt: skip
    figures["up_s"] = round(time.monotonic() - started, 2)
    if up.returncode != 0:
        sys.exit(f"stalwart up failed: {up.stderr}")
    state = json.loads(up.stdout)
    run_dir = Path(state["run_dir"])
    try:
        figures.update(asyncio.run(kill_and_replace(run_dir, opts.trainers)))
    finally:
        started = time.monotonic()
        down = cli("down", "--run-dir", str(run_dir))
        figures["down_s"] = round(time.monotonic() - started, 2)
    members = cluster.load(run_dir).members
    figures["left_running"] = [m.name for m in members if cluster._is_ours(m)]
    figures["load_after"] = load()
    figures["down_ok"] = down.returncode == 0
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
