"""``stalwart bench ddp``: the same training job through Stalwart and through torchrun + DDP.

Workload (both sides): ``digits-cnn`` width 16 (conv 1->16->32, fc 512->128->10),
3 data-parallel workers of 32 samples each, SGD lr 0.05 momentum 0.9, seed 0,
CPU, one intra-op thread per process; gradients reduced over workers as the
job's spec says on both sides (mean by default).

- Stalwart: one default local cluster (2 coordinators, a paramserver primary +
  backup, 3 trainers + 1 warm standby) for all trials. Per trial a fault-free
  job, then a job whose slot-1 trainer is killed -9 at step ``kill_at``
  (:func:`stalwart.demo.run.inject`, recovery read as ``bench recovery``
  reads it); the killed trainer is replaced by a new standby before the next
  trial. Both jobs' final weights are compared bit for bit with
  :func:`stalwart.training.reference_run`.
- DDP: :mod:`stalwart.bench.ddp_baseline`, a fault-free run and a run with
  rank 1 killed -9 at step ``kill_at``, checkpoints to /dev/shm every 10 steps;
  the killed run is compared bit for bit with the fault-free one.

Steady steps/s exclude start-up: the clock starts when step ``warmup`` is
done (Stalwart: its STEP_COMMITTED event; DDP: rank 0's timestamp) and stops
at the last step. Each figure is the median over ``trials``.

With :class:`LocalSgd` (``--local-steps H``) the Stalwart side runs
``steps / H`` outer steps of local SGD (DiLoCo's outer rule by default), so
each worker sees the same ``steps`` batches as a DDP rank; its throughput is
given in inner steps/s (outer steps/s x H), warm-up and kill step are divided
by H, and the held-out accuracy of both sides' final weights is reported, as
the two runs no longer compute the same weights.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from stalwart import cluster, training
from stalwart.api import common, coordinator
from stalwart.bench import ddp_baseline, steptimeline, window
from stalwart.bench.recovery import _recovered
from stalwart.client.coordinator import CoordinatorClient
from stalwart.demo import report
from stalwart.demo.run import inject
from stalwart.demo.watch import EventRecorder, param_client, pull_weights
from stalwart.models import default_spec

GOAL = 1.0
FAILURE_BELOW = 0.8


def workload(steps: int, seed: int = 0) -> coordinator.JobSpec:
    sgd = common.OptimizerSpec(kind=common.OPTIMIZER_KIND_SGD, lr=0.05, momentum=0.9)
    return default_spec("digits-cnn", model_args={"width": "16"}, num_slots=3, steps=steps,
                        batch_size=32, seed=seed, optimizer=sgd)  # fmt: skip


@dataclass(frozen=True)
class LocalSgd:
    """The Stalwart side as local SGD: H inner steps at ``inner_lr`` per outer step.

    The outer optimizer is SGD at ``outer_lr`` over the mean pseudo-gradient, with
    Nesterov momentum ``outer_momentum`` (DiLoCo's rule); momentum 0 and lr 1 is
    plain model averaging.
    """

    steps: int
    inner_lr: float = 0.2
    outer_lr: float = 0.7
    outer_momentum: float = 0.9

    def spec(self, steps: int, seed: int = 0) -> coordinator.JobSpec:
        """:func:`workload` as ``steps / H`` outer steps that read the same batches."""
        spec = workload(steps // self.steps, seed)
        momentum = self.outer_momentum
        spec.optimizer.CopyFrom(common.OptimizerSpec(
            kind=common.OPTIMIZER_KIND_SGD, lr=self.outer_lr, momentum=momentum,
            nesterov=momentum > 0,
        ))  # fmt: skip
        spec.local_steps, spec.local_lr = self.steps, self.inner_lr
        return spec

    def describe(self) -> str:
        outer = f"outer SGD lr {self.outer_lr} over the mean pseudo-gradient"
        if self.outer_momentum:
            outer += f", Nesterov momentum {self.outer_momentum}"
        return f"local SGD: {self.steps} inner SGD steps at lr {self.inner_lr} per push; {outer}"


async def _job(local, client, spec, warmup: int, kill_at: int | None, timeout_s: float) -> dict:
    job = await client.create_job(spec)
    recorder = EventRecorder(client, job.job_id)
    watch = asyncio.create_task(recorder.run())
    out: dict = {"job_id": job.job_id}
    try:
        if not await recorder.wait_step(warmup, timeout_s):
            raise TimeoutError(f"stalwart job at step {recorder.step} after {timeout_s:.0f}s")
        before = await steptimeline.scrape(local, spec)
        if kill_at is not None:
            await recorder.wait_step(kill_at, timeout_s)
            fault = await inject("trainer", local, client, job.job_id, recorder)
            rec = await _recovered(fault, recorder, 60)
            out["recovery_s"], out["victim"] = rec.recovery_s, fault.target
            out["steps_during"] = rec.steps_during
        if not await recorder.wait_step(spec.steps, timeout_s):
            raise TimeoutError(f"stalwart job at step {recorder.step} after {timeout_s:.0f}s")
        if kill_at is None:
            out["phases_ms"] = steptimeline.per_step_ms(
                before, await steptimeline.scrape(local, spec)
            )
            out["steps_per_s"] = window.steps_per_s(recorder.events, job.job_id, warmup, spec.steps)
        ps = await param_client(client, job.job_id, spec)
        try:
            out["version"], out["weights"] = await pull_weights(ps, job.job_id, spec.steps)
        finally:
            await ps.close()
    finally:
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
    return out


async def _stalwart_trial(local, spec, warmup: int, kill_at: int, timeout_s: float):
    async with CoordinatorClient(local.coordinator_addresses, retry_for_s=30.0) as client:
        clean = await _job(local, client, spec, warmup, None, timeout_s)
        faulty = await _job(local, client, spec, warmup, kill_at, timeout_s)
    return clean, faulty


def _accuracy(spec: coordinator.JobSpec, weights: dict[str, torch.Tensor]) -> float:
    """Held-out accuracy of ``spec``'s model carrying ``weights``."""
    return round(training.evaluate(spec, weights)["accuracy"], 4)


def _stalwart(
    spec, trials: int, warmup: int, kill_at: int, timeout_s: float, runs_root,
    accuracy: bool = False,
):  # fmt: skip
    reference = training.reference_run(spec)
    local = cluster.start(
        cluster.ClusterConfig(
            trainers=3, standbys=1, runs_root=runs_root, launcher=True, stop_with_caller=True
        )
    )
    rows = []
    try:
        asyncio.run(cluster.wait_healthy(local, 180))
        for _ in range(trials):
            clean, faulty = asyncio.run(_stalwart_trial(local, spec, warmup, kill_at, timeout_s))
            rows.append({
                "steps_per_s": clean["steps_per_s"],
                "phases_ms": clean["phases_ms"],
                "recovery_s": faulty.get("recovery_s"),
                "steps_repeated": 0 if report.bitwise_equal(faulty["weights"], reference)[0] else None,
                "clean_bitwise_equal": report.bitwise_equal(clean["weights"], reference)[0],
                "faulty_bitwise_equal": report.bitwise_equal(faulty["weights"], reference)[0],
            })  # fmt: skip
            if accuracy:
                rows[-1]["accuracy"] = _accuracy(spec, clean["weights"])
            if faulty.get("victim"):
                local.replace(faulty["victim"])  # back to 3 trainers + 1 standby
                asyncio.run(cluster.wait_healthy(local, 180))
    finally:
        local.stop(timeout_s=10)
    return rows, str(local.run_dir)


def _ddp(
    spec, trials: int, warmup: int, kill_at: int, timeout_s: float, accuracy: bool = False
) -> list[dict]:
    rows = []
    for _ in range(trials):
        clean = ddp_baseline.run(spec, warmup, timeout_s=timeout_s)
        faulty = ddp_baseline.run(spec, warmup, kill_at=kill_at, timeout_s=timeout_s)
        equal, _ = report.bitwise_equal(faulty.weights, clean.weights)
        rows.append({"steps_per_s": clean.steps_per_s, "recovery_s": faulty.recovery_s,
                     "steps_repeated": faulty.steps_repeated, "faulty_bitwise_equal": equal})  # fmt: skip
        if accuracy:
            rows[-1]["accuracy"] = _accuracy(spec, clean.weights)
    return rows


def _median(rows: list[dict], key: str, digits: int = 3) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return round(statistics.median(values), digits) if values else None


def run(
    trials: int = 3, steps: int = 400, warmup: int = 20, kill_at: int = 150,
    runs_root: Path = cluster.DEFAULT_RUNS_ROOT, timeout_s: float = 900.0,
    local: LocalSgd | None = None, bf16_gradients: bool = False,
) -> dict:  # fmt: skip
    """``bf16_gradients``: the Stalwart side's gradients travel as bfloat16
    (JobSpec.gradient_dtype; its own reference run rounds the same way); both
    sides' held-out accuracy is reported, as their weights differ."""
    training.make_deterministic(1)
    spec = workload(steps)
    started = time.monotonic()
    if local is None:
        ours_spec = _bf16(spec) if bf16_gradients else spec
        ours, run_dir = _stalwart(ours_spec, trials, warmup, kill_at, timeout_s, runs_root,
                                  accuracy=bf16_gradients)  # fmt: skip
        theirs = _ddp(spec, trials, warmup, kill_at, timeout_s, accuracy=bf16_gradients)
    else:
        h = local.steps  # Stalwart's clock and kill count outer steps
        ours_spec = _bf16(local.spec(steps)) if bf16_gradients else local.spec(steps)
        ours, run_dir = _stalwart(ours_spec, trials, warmup // h, kill_at // h,
                                  timeout_s, runs_root, accuracy=True)  # fmt: skip
        theirs = _ddp(spec, trials, warmup, kill_at, timeout_s, accuracy=True)
    s_rate, d_rate = _median(ours, "steps_per_s"), _median(theirs, "steps_per_s")
    if local is not None and s_rate:
        s_rate *= local.steps  # inner steps/s: batches per worker per second, as DDP's steps
    ratio = round(s_rate / d_rate, 3) if s_rate and d_rate else None
    result = {
        "workload": "digits-cnn width 16, 3 workers x 32 samples, SGD lr 0.05 momentum 0.9, "
        f"{steps} steps, CPU, 1 intra-op thread",
        "trials": trials,
        "steady_state": f"steps/s from the end of step {warmup} to the last step",
        "stalwart_steps_per_s": s_rate,
        "ddp_steps_per_s": d_rate,
        "ratio": ratio,
        "goal": f">= {GOAL} (below {FAILURE_BELOW} is a failure)",
        "stalwart_kill_to_next_step_s": _median(ours, "recovery_s"),
        "ddp_kill_to_next_step_s": _median(theirs, "recovery_s"),
        "stalwart_steps_repeated": _median(ours, "steps_repeated"),
        "ddp_steps_repeated": _median(theirs, "steps_repeated"),
        "stalwart_bitwise_equal_to_fault_free": all(r["faulty_bitwise_equal"] for r in ours),
        "stalwart_fault_free_bitwise_equal_to_reference": all(
            r["clean_bitwise_equal"] for r in ours
        ),
        "ddp_bitwise_equal_to_fault_free": all(r["faulty_bitwise_equal"] for r in theirs),
        "stalwart_step_ms": steptimeline.median_phases([r["phases_ms"] for r in ours]),
        "stalwart_trials": ours,
        "ddp_trials": theirs,
        "kill_at_step": kill_at,
        "cpus": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "wall_s": round(time.monotonic() - started, 1),
        "run_dir": run_dir,
    }
    if bf16_gradients:
        result = _bf16_fields(result, ours, theirs)
    return result if local is None else _local_fields(result, local, ours, theirs)


def _bf16(spec: coordinator.JobSpec) -> coordinator.JobSpec:
    out = coordinator.JobSpec()
    out.CopyFrom(spec)
    out.gradient_dtype = common.DTYPE_BFLOAT16
    return out


def _bf16_fields(result: dict, ours: list[dict], theirs: list[dict]) -> dict:
    """The result of a ``--bf16-gradients`` run: what travelled, and both accuracies."""
    return {"workload": result.pop("workload") + "; Stalwart side: gradients as bfloat16",
            "gradient_dtype": "bfloat16",
            "stalwart_accuracy": _median(ours, "accuracy", 4),
            "ddp_accuracy": _median(theirs, "accuracy", 4)} | result  # fmt: skip


def _local_fields(result: dict, local: LocalSgd, ours: list[dict], theirs: list[dict]) -> dict:
    """The result of a ``--local-steps`` run: rates named by what they count, and accuracies.

    ``ratio`` stays the throughput ratio (batches per worker per second on both
    sides), so readers of the plain run's JSON read it the same way.
    """
    inner = result.pop("stalwart_steps_per_s")
    out = {"workload": result.pop("workload") + f"; Stalwart side: {local.describe()}",
           "local_steps": local.steps,
           "stalwart_inner_steps_per_s": inner,
           "stalwart_outer_steps_per_s": _median(ours, "steps_per_s"),
           "ratio_of": "stalwart_inner_steps_per_s / ddp_steps_per_s",
           "stalwart_accuracy": _median(ours, "accuracy", 4),
           "ddp_accuracy": _median(theirs, "accuracy", 4),
           "stalwart_step_ms_per": "outer step",
           "stalwart_kill_at_outer_step": result["kill_at_step"] // local.steps}  # fmt: skip
    for row in ours:  # the per-trial rates are outer steps/s
        row["outer_steps_per_s"] = row.pop("steps_per_s")
    return out | result
