"""``stalwart bench recovery``: time from a kill -9 to the next committed step, per fault kind.

One local cluster (2 coordinators, a paramserver primary + backup, 2 trainers
and a warm standby) trains one long sync job. Round after round, for each kind
(trainer, paramserver primary, coordinator leader) the current holder is killed
-9 at a step boundary, the recovery is read from the coordinator's events with
the demo's rules (:mod:`stalwart.demo.timeline`), and a stand-in is started for
the dead process (:meth:`LocalCluster.replace`) so the next round finds the
cluster whole again. At the end the job is cancelled, and its weights are
compared bit for bit with a fault-free run of as many steps: a lost or doubly
applied step would change them.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

from stalwart import cluster, models, training
from stalwart.client.coordinator import CoordinatorClient
from stalwart.demo import report, timeline
from stalwart.demo.run import inject
from stalwart.demo.watch import EventRecorder, param_client, pull_weights

KINDS = ("trainer", "paramserver", "coordinator")
GOALS_S = {"trainer": 1.0, "paramserver": 1.0, "coordinator": 2.0}


def bench_spec():
    return models.default_spec(
        "digits-cnn", model_args={"width": "8"}, num_slots=2, steps=10**6, batch_size=16, seed=11
    )


async def _recovered(fault, recorder, timeout_s: float) -> timeline.Recovery:
    deadline = time.monotonic() + timeout_s
    while True:
        rec = timeline.recover(fault, recorder.events)
        if rec.resumed_at is not None or time.monotonic() > deadline:
            return rec
        await asyncio.sleep(0.2)


async def _trials(local, client, job_id, recorder, trials: int, between: int, out: list) -> None:
    """Append a Recovery per kill to ``out`` (kept if a later round fails)."""
    for _ in range(trials):
        for kind in KINDS:
            await recorder.wait_step(recorder.step + between, 60)  # steady state again
            await recorder.wait_step(recorder.step + 1, 10)  # kill just after a commit
            fault = await inject(kind, local, client, job_id, recorder)
            out.append(await _recovered(fault, recorder, 30))
            await asyncio.to_thread(local.replace, fault.target)
            await cluster.wait_healthy(local, 120)


async def _measure(local, trials: int, between: int) -> dict:
    spec = bench_spec()
    async with CoordinatorClient(local.coordinator_addresses, retry_for_s=30.0) as client:
        job = await client.create_job(spec)
        recorder = EventRecorder(client, job.job_id)
        watch = asyncio.create_task(recorder.run())
        try:
            recs: list[timeline.Recovery] = []
            aborted = ""
            try:
                await _trials(local, client, job.job_id, recorder, trials, between, recs)
            except (cluster.ClusterError, TimeoutError) as exc:
                aborted = str(exc).splitlines()[0]  # report the rounds that ran
            await client.cancel_job(job.job_id, "benchmark over")
            await asyncio.sleep(1.0)  # let the last step in flight land
            ps = await param_client(client, job.job_id, spec)
            try:
                version, weights = await pull_weights(ps, job.job_id)
            finally:
                await ps.close()
            await recorder.wait_step(version, 3.0)
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
    return {"spec": spec, "recoveries": recs, "version": version, "weights": weights,
            "events": list(recorder.events), "job_id": job.job_id, "aborted": aborted}  # fmt: skip


def run(trials: int = 3, between: int = 20, runs_root: Path = cluster.DEFAULT_RUNS_ROOT) -> dict:
    training.make_deterministic(1)
    local = cluster.start(
        cluster.ClusterConfig(
            trainers=2, standbys=1, runs_root=runs_root, launcher=True, stop_with_caller=True
        )
    )
    try:
        asyncio.run(cluster.wait_healthy(local, 120))
        m = asyncio.run(_measure(local, trials, between))
    finally:
        local.stop(timeout_s=10)
    spec, version = m["spec"], m["version"]
    equal, differ = report.bitwise_equal(m["weights"], training.reference_run(spec, version))
    audit = timeline.audit_steps(m["events"], m["job_id"], version)
    kinds = {}
    for kind in KINDS:
        recs = [r for r in m["recoveries"] if r.fault.kind == kind]
        times = [r.recovery_s for r in recs if r.recovery_s is not None]
        kinds[kind] = {
            "trials": len(recs),
            "recovered": len(times),
            "median_s": round(statistics.median(times), 3) if times else None,
            "max_s": round(max(times), 3) if times else None,
            "median_detection_s": _median([r.detection_s for r in recs]),
            "recovery_s": [
                None if t is None else round(t, 3) for t in (r.recovery_s for r in recs)
            ],  # fmt: skip
            "goal_s": GOALS_S[kind],
        }
    return {
        "kill_to_next_commit": kinds,
        "steps": version,
        # A lost or doubly applied gradient changes the weights: bitwise equality with a
        # fault-free run of as many steps is the count of lost/repeated steps being 0.
        "lost_or_repeated_steps": 0 if equal else None,
        "bitwise_equal_to_reference": equal,
        # STEP_COMMITTED is announced at most once per step; a leader killed between
        # writing the job and its events leaves a gap in the announcements only.
        "steps_not_announced": len(audit.missing),
        "steps_announced_twice": len(audit.repeated),
        "tensors_differing": differ,
        "goal_lost_or_repeated": 0,
        "run_dir": str(local.run_dir),
        "aborted": m["aborted"],
        "trials": [r.to_dict(local.started_at) for r in m["recoveries"]],
    }


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 3) if values else None
