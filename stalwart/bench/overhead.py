"""``stalwart bench overhead``: training throughput through Stalwart vs a plain torch loop.

Both sides train the same ``mlp`` (same size, batch, optimizer, seed, and one
intra-op thread, as every Stalwart process uses) in the same run:

- plain: one process, ``model(x)``, ``backward()``, ``optimizer.step()`` with the
  optimizer built as the paramserver builds it;
- Stalwart: a local cluster with 1 trainer and a paramserver primary replicating
  to one backup (replication on), sync mode. Each step pulls the weights,
  computes the gradient, pushes it, and the primary applies it on itself and its
  backup before acknowledging.

Throughput is steady-state samples/s: the first ``warmup`` steps are not timed.
On the cluster the clock is the coordinator's STEP_COMMITTED events, stamped when
the leader's 100 ms poll sees the version move (so the window must be long:
:mod:`stalwart.bench.window` refuses one under 2 s).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import torch

from stalwart import cluster, optim, training
from stalwart.api import coordinator
from stalwart.bench import window
from stalwart.client.coordinator import CoordinatorClient
from stalwart.demo.watch import EventRecorder
from stalwart.models import default_spec, resolve

GOAL = 0.9


def mlp_spec(steps: int, batch_size: int, hidden: int) -> coordinator.JobSpec:
    return default_spec(
        "mlp", num_slots=1, steps=steps, batch_size=batch_size, model_args={"hidden": str(hidden)}
    )


def plain_loop(spec: coordinator.JobSpec, warmup: int) -> float:
    """Samples/s of a single-process torch loop over steps warmup..spec.steps."""
    task = resolve(spec)
    model = task.build_model(spec.seed)
    opt = optim.build(spec.optimizer, list(model.parameters()))
    started = 0.0
    for step in range(spec.steps):
        if step == warmup:
            started = time.perf_counter()
        x, y = task.batch(spec.seed, 0, step, spec.batch_size)
        opt.zero_grad(set_to_none=True)
        task.loss(model, x, y).backward()
        opt.step()
    return (spec.steps - warmup) * spec.batch_size / (time.perf_counter() - started)


async def through_stalwart(
    local: cluster.LocalCluster, spec: coordinator.JobSpec, warmup: int, timeout_s: float
) -> float:
    async with CoordinatorClient(local.coordinator_addresses, retry_for_s=30.0) as client:
        job = await client.create_job(spec)
        recorder = EventRecorder(client, job.job_id)
        watch = asyncio.create_task(recorder.run())
        try:
            if not await recorder.wait_step(spec.steps, timeout_s):
                raise TimeoutError(f"mlp job at step {recorder.step} after {timeout_s:.0f}s")
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
    # version `warmup` committed = `warmup` steps done; the window holds the rest
    return window.steps_per_s(recorder.events, job.job_id, warmup, spec.steps) * spec.batch_size


def run(
    steps: int = 150, warmup: int = 30, batch_size: int = 64, hidden: int = 1024,
    runs_root: Path = cluster.DEFAULT_RUNS_ROOT, timeout_s: float = 600.0,
) -> dict:  # fmt: skip
    training.make_deterministic(1)  # the trainer's setting: one intra-op thread
    spec = mlp_spec(steps, batch_size, hidden)
    plain = plain_loop(spec, warmup)
    local = cluster.start(
        cluster.ClusterConfig(
            trainers=1, standbys=0, runs_root=runs_root, launcher=True, stop_with_caller=True
        )
    )
    try:
        asyncio.run(cluster.wait_healthy(local, 120))
        ours = asyncio.run(through_stalwart(local, spec, warmup, timeout_s))
    finally:
        local.stop(timeout_s=10)
    params = sum(p.numel() for p in resolve(spec).build_model(0).parameters())
    return {
        "model": "mlp",
        "parameters": params,
        "batch_size": batch_size,
        "optimizer": "adam",
        "timed_steps": steps - warmup,
        "plain_samples_per_s": round(plain, 1),
        "stalwart_samples_per_s": round(ours, 1),
        "ratio": round(ours / plain, 3),
        "goal": f">= {GOAL}",
        "replication": "primary + 1 backup, min_insync 1",
        "cpus": os.cpu_count(),
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "run_dir": str(local.run_dir),
    }
