"""Start-up figures of a local cluster (docs/performance.md, "Start-up").

    .venv/bin/python scripts/startup_figures.py [--trainers 2] [--no-preload | --preload-only]

Runs the baseline (``stalwart up --no-preload``: a fresh interpreter per service) and
then the launcher arm in the same run, each as below, and prints both and the speedup
of each figure (baseline / launcher):

1. ``stalwart up --standbys 0`` as a subprocess: seconds from its start until it returns
   (everything serving and registered with the leader);
2. a digits-cnn job on every trainer; after step 5, just after a step is committed
   (the coordinator's events), ``kill -9`` of ``trainer-1``'s process group
   (``trainer-0`` with ``--trainers 1``): seconds until the next committed step and
   the one after (the next may have been pushed for before the kill). Nothing
   restarts a trainer in ``stalwart up``: with 2 or more trainers the dead one's slot
   spills onto the survivors (elastic slots) and the stand-in of 3. starts afterwards;
   with 1, the stand-in starts as soon as the trainer is gone and the step waits for it;
3. a stand-in for it (``LocalCluster.replace``, from the state file, as a later
   command would): seconds until it serves and seconds until the leader lists it alive;
4. ``stalwart down``: seconds, and whether any process of the run is left.

The load average is read before and after each arm.
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
from stalwart.demo.watch import EventRecorder

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stalwart.cli.main", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, check=False)  # fmt: skip


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


async def stand_in_for(local: cluster.LocalCluster, client: CoordinatorClient, name: str) -> dict:
    """Start the stand-in of ``name`` once it is gone; seconds until it serves and until
    the leader lists it alive."""
    while local.alive(name):
        await asyncio.sleep(0.01)
    started = time.monotonic()
    member = await asyncio.to_thread(local.replace, name)
    serving = time.monotonic() - started
    while True:
        nodes = await client.all_nodes()
        if any(n.node_id == member.name and n.state == coordinator.NODE_STATE_ALIVE
               for n in nodes):  # fmt: skip
            break
        await asyncio.sleep(0.01)
    return {"replacement_serving_s": round(serving, 3),
            "replacement_registered_s": round(time.monotonic() - started, 3)}  # fmt: skip


async def kill_and_replace(run_dir: Path, trainers: int) -> dict:
    local = cluster.load(run_dir)
    out: dict = {}
    async with CoordinatorClient(local.coordinator_addresses) as client:
        spec = coordinator.JobSpec(model="digits-cnn", num_slots=trainers, steps=100_000,
                                   batch_size=16, seed=0)  # fmt: skip
        job = await client.create_job(spec)
        recorder = EventRecorder(client, job.job_id)  # STEP_COMMITTED as they come
        watch = asyncio.create_task(recorder.run())
        try:
            assert await recorder.wait_step(5, 300), "the job did not reach step 5"
            assert await recorder.wait_step(recorder.step + 1, 30)  # kill just after a commit
            victim = local.member("trainer-1" if trainers > 1 else "trainer-0")
            stand_in_of = stand_in_for(local, client, victim.name)
            step = recorder.step
            killed = time.monotonic()
            os.killpg(victim.pid, signal.SIGKILL)
            # One trainer: nobody else can compute its slot, so the stand-in starts at
            # once and the step waits for it. More: the slot spills onto the survivors.
            stand_in = None if trainers > 1 else asyncio.create_task(stand_in_of)
            assert await recorder.wait_step(step + 1, 300), "no step after the kill"
            out["kill_to_next_step_s"] = round(time.monotonic() - killed, 3)
            # the next step may have been pushed for before the kill (a trainer pulls
            # step + 1 as it pushes step): the one after is the first it cannot have
            assert await recorder.wait_step(step + 2, 300), "no second step after the kill"
            out["kill_to_second_step_s"] = round(time.monotonic() - killed, 3)
            out.update(await (stand_in or stand_in_of))
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
        await client.cancel_job(job.job_id, "start-up figures done")
    return out


RATIO_FIGURES = (
    "up_s",
    "kill_to_next_step_s",
    "kill_to_second_step_s",
    "replacement_serving_s",
    "replacement_registered_s",
)


def measure(preload: bool, trainers: int, runs_root: str) -> dict:
    """One arm: ``stalwart up`` (with or without the launcher), the kill, the stand-in,
    ``stalwart down``."""
    figures: dict = {"preload": preload, "load_before": load()}
    started = time.monotonic()
    up = cli("up", "--trainers", str(trainers), "--standbys", "0", "--runs-root", runs_root,
             "-o", "json", *([] if preload else ["--no-preload"]))  # fmt: skip
    figures["up_s"] = round(time.monotonic() - started, 2)
    if up.returncode != 0:
        sys.exit(f"stalwart up failed: {up.stderr}")
    run_dir = Path(json.loads(up.stdout)["run_dir"])
    try:
        figures.update(asyncio.run(kill_and_replace(run_dir, trainers)))
    finally:
        started = time.monotonic()
        down = cli("down", "--run-dir", str(run_dir))
        figures["down_s"] = round(time.monotonic() - started, 2)
    members = cluster.load(run_dir).members
    figures["left_running"] = [m.name for m in members if cluster._is_ours(m)]
    figures["load_after"] = load()
    figures["down_ok"] = down.returncode == 0
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trainers", type=int, default=2)
    parser.add_argument("--runs-root", default="/tmp/startup-runs")
    parser.add_argument("--no-preload", action="store_true",
                        help="only the baseline arm (a fresh interpreter per service)")  # fmt: skip
    parser.add_argument("--preload-only", action="store_true", help="only the launcher arm")
    opts = parser.parse_args()
    arms = {}
    if not opts.preload_only:  # the baseline first, in the same run
        arms["fresh"] = measure(False, opts.trainers, opts.runs_root)
    if not opts.no_preload:
        arms["launcher"] = measure(True, opts.trainers, opts.runs_root)
    if len(arms) == 2:  # how many times faster the launcher made each figure
        arms["speedup"] = {k: round(arms["fresh"][k] / arms["launcher"][k], 2)
                           for k in RATIO_FIGURES
                           if arms["fresh"].get(k) and arms["launcher"].get(k)}  # fmt: skip
    print(json.dumps(arms))


if __name__ == "__main__":
    main()
