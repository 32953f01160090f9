"""``stalwart demo``: train a real model on a local cluster while killing its processes.

The script: start a local cluster (2 coordinators, a paramserver primary and
backup, N trainers and M standbys), submit the model (``digits-cnn`` unless
``DemoConfig.model`` says otherwise, e.g. ``char-lm``) in sync mode, and at
fixed fractions of the run kill -9 a slot's trainer, the paramserver primary and
the coordinator leader, each chosen at kill time from what the cluster reports.
With the health service on (the default), ``trainer-0`` also heats up from
8% of the run (test fault ``heat_from_step``) and has a scripted death at 22%:
the health service predicts the failure from its telemetry and the coordinator
drains it, so its slot moves to the warm standby and the death never comes.
Meanwhile the cluster's events are recorded and the weights are sampled for
held-out accuracy. At the end: the final weights are pulled and evaluated, a
fault-free reference run is computed in this process, and the report compares
them bit for bit.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from stalwart import cluster, training
from stalwart.api import coordinator
from stalwart.bench import steptimeline
from stalwart.client.coordinator import FINISHED, CoordinatorClient
from stalwart.demo import report, timeline
from stalwart.demo.watch import EventRecorder, Sampler, param_client, pull_weights, version_on
from stalwart.models import default_spec

DEFAULT_SCHEDULE = (("trainer", 0.25), ("paramserver", 0.5), ("coordinator", 0.75))
HEATED = "trainer-0"
MIN_HEAT_MARGIN = 10  # steps between the heat and the scripted death, or no heating

# (what happened, step, of steps) -> None: the CLI draws its progress bar with it.
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class DemoConfig:
    model: str = "digits-cnn"
    steps: int = 400
    trainers: int = 3
    standbys: int = 1
    seed: int = 0
    model_args: dict[str, str] = field(default_factory=dict)
    batch_size: int = 0  # 0: the model's default
    schedule: tuple[tuple[str, float], ...] = DEFAULT_SCHEDULE
    """(fault kind, fraction of the steps at which to kill) in order."""
    runs_root: Path = cluster.DEFAULT_RUNS_ROOT
    sample_interval_s: float = 1.0
    job_timeout_s: float = 900.0
    stall_timeout_s: float = 90.0
    """Give up when no step commits for this long (a hung cluster, not a slow one)."""
    start_timeout_s: float = 180.0
    reference: bool = True
    """Compute the fault-free reference run and compare bitwise."""
    health: bool = True
    """Run the health service; ``HEATED`` heats up and must be drained before it dies."""
    heat: tuple[float, float] = (0.08, 0.22)
    """(fraction of the steps where HEATED starts heating, where its scripted death is)."""


def heat_steps(config: DemoConfig) -> tuple[int, int] | None:
    """(heat_from_step, crash_at_step) of HEATED, or None when the demo heats nobody."""
    heat_from = max(2, int(config.steps * config.heat[0]))
    crash_at = int(config.steps * config.heat[1])
    if not config.health or crash_at - heat_from < MIN_HEAT_MARGIN:
        return None
    return heat_from, crash_at


def cluster_config(config: DemoConfig) -> cluster.ClusterConfig:
    heat = heat_steps(config)
    faults = {}
    if heat is not None:  # a run too short to heat anybody heats nobody
        faults = {HEATED: ("--faults", f"heat_from_step={heat[0]},crash_at_step={heat[1]}")}
    # The heated trainer's slot goes to a standby of its own, so the trainer kill at 25%
    # still finds one, as it does without the health service. Services fork from one
    # launcher that imported torch once, as under `stalwart up` (docs/performance.md).
    return cluster.ClusterConfig(
        trainers=config.trainers, standbys=config.standbys + (1 if heat else 0),
        runs_root=config.runs_root,
        start_timeout_s=config.start_timeout_s, health=config.health,
        member_args=faults, launcher=True, stop_with_caller=True,
    )  # fmt: skip


def job_spec(config: DemoConfig) -> coordinator.JobSpec:
    overrides = dict(num_slots=config.trainers, steps=config.steps, seed=config.seed)
    if config.model_args:
        overrides["model_args"] = config.model_args
    if config.batch_size:
        overrides["batch_size"] = config.batch_size
    return default_spec(config.model, **overrides)


async def pick_target(
    kind: str, local: cluster.LocalCluster, client: CoordinatorClient, job_id: str
) -> str:
    """The member to kill, as the cluster reports it right now."""
    if kind == "trainer":
        for _ in range(150):  # 30 s: a slot may be between holders right now
            job = await client.get_job(job_id)
            held = [s for s in job.slots if s.node_id]
            if held:
                return (held[1] if len(held) > 1 else held[0]).node_id
            await asyncio.sleep(0.2)
        raise TimeoutError(f"no trainer holds a slot of {job_id}")
    if kind == "paramserver":
        shard_map = await client.get_shard_map(job_id)
        return local.by_address(shard_map.groups[0].primary_address).name
    if kind == "coordinator":
        status = await client.cluster_status()
        return local.by_address(status.leader_address).name
    raise ValueError(f"unknown fault kind {kind!r}")


async def inject(
    kind: str,
    local: cluster.LocalCluster,
    client: CoordinatorClient,
    job_id: str,
    recorder: EventRecorder,
) -> timeline.Fault:
    name = await pick_target(kind, local, client, job_id)
    step = recorder.step
    if kind == "paramserver":
        # The event stream learns of commits from the paramservers' polls and can
        # trail them by a step or two; a commit made before the kill must not count
        # as the recovery, so take the step from the primary itself.
        held = await version_on(local.member(name).address, job_id)
        if held is not None:
            step = max(step, held)
    killed_at = time.time()
    await asyncio.to_thread(local.kill, name)
    return timeline.Fault(kind, name, killed_at, step)


async def wait_finished(
    client: CoordinatorClient,
    job_id: str,
    timeout_s: float,
    stall_s: float,
    on_step: Callable[[int], None],
) -> coordinator.Job:
    deadline = time.monotonic() + timeout_s
    last_step, moved = -1, time.monotonic()
    while True:
        job = await client.get_job(job_id)
        on_step(job.step)
        if job.state in FINISHED:
            return job
        now = time.monotonic()
        if job.step != last_step:
            last_step, moved = job.step, now
        if now > deadline or now - moved > stall_s:
            raise TimeoutError(
                f"job {job_id} stuck at step {job.step} (no step for {now - moved:.0f}s, "
                f"{timeout_s:.0f}s allowed in all); see the logs"
            )
        await asyncio.sleep(0.3)


async def wait_step(recorder: EventRecorder, step: int, stall_s: float) -> None:
    """Until ``step`` commits; TimeoutError when no step commits for ``stall_s``."""
    while True:
        before = recorder.step
        if await recorder.wait_step(step, stall_s):
            return
        if recorder.step == before:
            raise TimeoutError(
                f"job stuck at step {before} (no step for {stall_s:.0f}s); see the logs"
            )


async def run(config: DemoConfig, progress: Progress | None = None) -> dict:
    """Run the whole demo; returns the report (see :mod:`stalwart.demo.report`)."""
    say = progress or (lambda *_: None)
    training.make_deterministic(1)
    t0 = time.time()
    spec = job_spec(config)
    say("starting the cluster", 0, config.steps)
    local = await asyncio.to_thread(cluster.start, cluster_config(config))
    stopped = False
    try:
        await cluster.wait_healthy(local, config.start_timeout_s)
        started = time.time()
        result = await _train(config, spec, local, say)
        say("stopping the cluster; computing the fault-free reference", config.steps, config.steps)
        stop = asyncio.create_task(asyncio.to_thread(local.stop, 15.0))
        ref_started = time.time()
        reference = (
            await asyncio.to_thread(training.reference_run, spec) if config.reference else None
        )
        ref_s = time.time() - ref_started
        await stop
        stopped = True
    finally:
        if not stopped:
            await asyncio.to_thread(local.stop, 10.0)
    return report.build(
        config=config, spec=spec, local=local, t0=t0, started=started, result=result,
        reference=reference, reference_s=ref_s, finished=time.time(),
        heat=(HEATED, *heat_steps(config)) if heat_steps(config) else None,
    )  # fmt: skip


@dataclass
class TrainResult:
    job: coordinator.Job
    faults: list[timeline.Fault]
    events: list[timeline.Ev]
    samples: list
    final_version: int
    final_params: dict[str, torch.Tensor]
    final_metrics: dict[str, float]
    training_s: float
    sampler_errors: int
    heated_alive: bool | None = None  # HEATED still running at the end (None: not heated)
    step_ms: dict[str, float] = field(default_factory=dict)  # the step timeline


async def _train(
    config: DemoConfig, spec: coordinator.JobSpec, local: cluster.LocalCluster, say: Progress
) -> TrainResult:
    async with CoordinatorClient(local.coordinator_addresses, retry_for_s=30.0) as client:
        job = await client.create_job(spec)
        submitted = time.time()
        recorder = EventRecorder(client, job.job_id)
        sampler = Sampler(client, job, config.sample_interval_s)
        tasks = [asyncio.create_task(recorder.run()), asyncio.create_task(sampler.run())]
        faults: list[timeline.Fault] = []
        try:
            for kind, fraction in config.schedule:
                at = max(1, int(config.steps * fraction))
                ticker = asyncio.create_task(_tick(recorder, say, "training", config.steps))
                try:
                    await wait_step(recorder, at, config.stall_timeout_s)
                finally:
                    ticker.cancel()
                # The event stream can trail the job by several steps on a loaded
                # machine: ask where the job is before killing for nothing.
                if recorder.finished or (await client.get_job(job.job_id)).step >= spec.steps:
                    break
                fault = await inject(kind, local, client, job.job_id, recorder)
                faults.append(fault)
                say(f"kill -9 {kind} {fault.target}", recorder.step, config.steps)
            job = await wait_finished(
                client, job.job_id, config.job_timeout_s, config.stall_timeout_s,
                lambda step: say("training", step, config.steps),
            )  # fmt: skip
            training_s = time.time() - submitted
            # what the live trainers and paramservers recorded, faults included
            step_ms = steptimeline.per_step_ms({}, await steptimeline.scrape(local))
            ps = await param_client(client, job.job_id, spec)
            try:
                version, params = await pull_weights(ps, job.job_id, min(job.step, spec.steps))
            finally:
                await ps.close()
            metrics = training.evaluate(spec, params)
            await recorder.wait_step(job.step, 3.0)  # the last STEP_COMMITTED events
            await asyncio.sleep(0.5)
            heated_alive = local.alive(HEATED) if heat_steps(config) else None
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    return TrainResult(job, faults, list(recorder.events), list(sampler.samples), version,
                       params, metrics, training_s, sampler.errors, heated_alive, step_ms)  # fmt: skip


async def _tick(recorder: EventRecorder, say: Progress, what: str, total: int) -> None:
    while True:
        say(what, recorder.step, total)
        await asyncio.sleep(0.2)
