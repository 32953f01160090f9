"""Helpers of the local-cluster tests: a small job, a kill at a step, the final weights."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from stalwart import cluster, models, training
from stalwart.api import coordinator
from stalwart.client.coordinator import FINISHED, CoordinatorClient
from stalwart.demo.run import pick_target
from stalwart.demo.timeline import Ev
from stalwart.demo.watch import EventRecorder, param_client, pull_weights
from tests.helpers import PRELOAD

JOB_TIMEOUT_S = 120.0


def small_spec(steps: int = 40, seed: int = 3) -> coordinator.JobSpec:
    """digits-cnn small enough for two shared cores: a few seconds of training."""
    return models.default_spec(
        "digits-cnn", model_args={"width": "8"}, num_slots=2, steps=steps, batch_size=16, seed=seed
    )


@dataclass
class Outcome:
    job: coordinator.Job
    events: list[Ev]
    weights: dict[str, torch.Tensor]
    version: int
    killed: str = ""
    killed_at_step: int = -1
    kills: list[tuple[str, int]] = field(default_factory=list)  # (member, step) in order


@contextlib.contextmanager
def running_cluster(root: Path, **config) -> Iterator[cluster.LocalCluster]:
    """A local cluster of ``ClusterConfig(**config)`` under ``root``, healthy, stopped
    on the way out."""
    started = cluster.start(
        cluster.ClusterConfig(runs_root=root, preload_services=PRELOAD, **config)
    )
    try:
        asyncio.run(cluster.wait_healthy(started, 120))
        yield started
    finally:
        started.stop(timeout_s=10)


@contextlib.asynccontextmanager
async def watched_job(
    client: CoordinatorClient, spec: coordinator.JobSpec
) -> AsyncIterator[tuple[coordinator.Job, EventRecorder]]:
    """Submit ``spec``; the job and a recorder of its events, stopped on the way out."""
    job = await client.create_job(spec)
    recorder = EventRecorder(client, job.job_id)
    watch = asyncio.create_task(recorder.run())
    try:
        yield job, recorder
    finally:
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watch


async def run_job(
    local: cluster.LocalCluster,
    spec: coordinator.JobSpec,
    kill: str = "",
    at_step: int = 0,
    schedule: Sequence[tuple[str, int]] = (),
) -> Outcome:
    """Submit ``spec``; at step ``at_step`` kill -9 the ``kill`` kind (or each
    ``(kind, step)`` of ``schedule`` in turn; kinds as :func:`_targets` takes them);
    wait for the end."""
    plan = list(schedule) or ([(kill, at_step)] if kill else [])
    kills: list[tuple[str, int]] = []
    async with (
        CoordinatorClient(local.coordinator_addresses, retry_for_s=30.0) as client,
        watched_job(client, spec) as (job, recorder),
    ):
        for kind, step in plan:
            assert await recorder.wait_step(step, JOB_TIMEOUT_S), "job never got there"
            names = await _targets(kind, local, client, job.job_id)
            kills.append((names[0], recorder.step))
            for name in names:
                await asyncio.to_thread(local.kill, name)
            if kind.startswith("group:"):  # a stand-in, as Kubernetes would start one
                await _says_group_lost(client, job.job_id, int(kind.split(":")[1]))
                await asyncio.to_thread(local.replace, names[0])
        job, version, weights = await finish_and_pull(client, job, spec)
        await recorder.wait_step(spec.steps, 5.0)  # the last STEP_COMMITTED events
    killed, killed_at = kills[0] if kills else ("", -1)
    return Outcome(job, list(recorder.events), weights, version, killed, killed_at, kills)


async def _says_group_lost(client: CoordinatorClient, job_id: str, shard: int) -> None:
    """The running job's reason names the lost group until a stand-in restores it
    (nothing else shows why its step stands still)."""
    want = f"waiting: every replica of shard group {shard} lost"
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while not (job := await client.get_job(job_id)).reason.startswith(want):
        assert job.state == coordinator.JOB_STATE_RUNNING, job.reason
        assert time.monotonic() < deadline, f"the job's reason is still {job.reason!r}"
        await asyncio.sleep(0.1)


async def _targets(kind: str, local, client: CoordinatorClient, job_id: str) -> list[str]:
    """The members to kill: one of the demo's fault kinds; ``paramserver:<shard>``, that
    group's primary; ``group:<shard>``, every live replica of that group (which
    :func:`run_job` then replaces with one stand-in)."""
    if kind.startswith("paramserver:"):
        shard_map = await client.get_shard_map(job_id)
        group = shard_map.groups[int(kind.split(":")[1])]
        return [local.by_address(group.primary_address).name]
    if kind.startswith("group:"):
        shard = int(kind.split(":")[1])
        replicas = [m.name for m in local.of_role("paramserver") if m.shard == shard]
        return [name for name in replicas if local.alive(name)]
    return [await pick_target(kind, local, client, job_id)]


async def finish_and_pull(client: CoordinatorClient, job: coordinator.Job, spec):
    """Wait (up to JOB_TIMEOUT_S) for the job to end; then its final version and weights."""
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while job.state not in FINISHED:
        assert time.monotonic() < deadline, f"job stuck at step {job.step}"
        await asyncio.sleep(0.3)
        job = await client.get_job(job.job_id)
    ps = await param_client(client, job.job_id, spec)
    try:
        version, weights = await pull_weights(ps, job.job_id, spec.steps)
    finally:
        await ps.close()
    return job, version, weights


def assert_bitwise_equal(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for name in want:
        assert torch.equal(got[name], want[name]), f"{name} differs from the fault-free run"


def reference(spec: coordinator.JobSpec) -> dict[str, torch.Tensor]:
    training.make_deterministic(1)
    return training.reference_run(spec)
