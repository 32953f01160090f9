"""Watching a running job: the event stream, and samples of its weights' held-out quality.

:class:`EventRecorder` keeps every event of the cluster (it follows the leader
through failover, resuming after the last sequence it saw) and wakes waiters
when the job's step moves. :class:`Sampler` pulls the job's current weights from
the paramservers now and then and evaluates them on the held-out split, for the
accuracy/loss curves of the report.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

import grpc
import torch

from stalwart import training
from stalwart.api import common, coordinator
from stalwart.client.coordinator import CoordinatorClient
from stalwart.client.paramserver import ParamServerClient, ShardGroupClient
from stalwart.demo.timeline import Ev
from stalwart.errors import RpcError
from stalwart.models import resolve


def to_ev(event: common.Event) -> Ev:
    return Ev(
        sequence=event.sequence,
        kind=common.EventKind.Name(event.kind).removeprefix("EVENT_KIND_"),
        time=event.time.seconds + event.time.nanos / 1e9,
        job_id=event.job_id,
        node_id=event.node_id,
        step=event.step,
        message=event.message,
    )


class EventRecorder:
    """Records the cluster's events; ``step`` is the job's highest committed step seen."""

    def __init__(self, client: CoordinatorClient, job_id: str):
        self.client = client
        self.job_id = job_id
        self.events: list[Ev] = []
        self.step = 0
        self.finished = False  # the job reached a final state
        self._changed = asyncio.Event()

    async def run(self) -> None:
        async for event in self.client.watch_events():
            ev = to_ev(event)
            self.events.append(ev)
            if ev.job_id == self.job_id:
                if ev.kind == "STEP_COMMITTED":
                    self.step = max(self.step, ev.step)
                elif ev.kind == "JOB_STATE_CHANGED" and _final(ev.message):
                    self.finished = True
                self._changed.set()

    async def wait_step(self, step: int, timeout_s: float) -> bool:
        """Until the job has committed ``step`` steps (or finished); False on timeout."""
        deadline = time.monotonic() + timeout_s
        while self.step < step and not self.finished:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)
        return True


def _final(message: str) -> bool:
    return any(f"-> {s}" in message for s in ("SUCCEEDED", "FAILED", "CANCELLED", "succeeded",
                                               "failed", "cancelled"))  # fmt: skip


@dataclass(frozen=True)
class Sample:
    time: float
    step: int
    accuracy: float
    loss: float


async def param_client(client: CoordinatorClient, job_id: str, spec) -> ParamServerClient:
    """A paramserver client for the job's shard groups (primary and backups of each)."""
    shard_map = await client.get_shard_map(job_id)
    groups = []
    for group in sorted(shard_map.groups, key=lambda g: g.shard):
        addresses = list(dict.fromkeys(a for a in [group.primary_address,
                                                    *group.backup_addresses] if a))  # fmt: skip
        groups.append(ShardGroupClient(addresses, call_timeout_s=10, retry_for_s=30))  # fmt: skip
    ps = ParamServerClient(groups)
    ps.plan(training.initial_params(resolve(spec), spec.seed))
    return ps


async def version_on(address: str, job_id: str) -> int | None:
    """The version ``job_id`` stands at on the paramserver replica at ``address``
    (None: it does not answer, or holds no such job)."""
    group = ShardGroupClient([address])
    try:
        status = await group.status(address)
    except RpcError:
        return None
    finally:
        await group.close()
    return next((j.version for j in status.jobs if j.job_id == job_id), None)


async def pull_weights(
    ps: ParamServerClient, job_id: str, min_version: int = 0, optimizer_state: bool = False
) -> tuple[int, dict[str, torch.Tensor]]:
    """The job's weights at a version every shard group agrees on (>= ``min_version``);
    with ``optimizer_state`` also the optimizer's tensors (``<param>/<key>``)."""
    for _ in range(100):  # a commit may land on some groups first: pull again
        versions, params = await ps.pull(job_id, -1, min_version, optimizer_state)
        if min(versions) == max(versions):
            return versions[0], params
        min_version = max(versions)
    raise RpcError(grpc.StatusCode.UNAVAILABLE, "shard groups never agreed on a version")


class Sampler:
    """Every ``interval_s``, pull the weights and evaluate them (held-out accuracy and loss)."""

    def __init__(self, client: CoordinatorClient, job: coordinator.Job, interval_s: float = 1.0):
        self.client = client
        self.job = job
        self.interval_s = interval_s
        self.samples: list[Sample] = []
        self.errors = 0
        self._task_model = None

    def _evaluate(self, params) -> dict[str, float]:
        spec = self.job.spec
        if self._task_model is None:
            task = resolve(spec)
            self._task_model = (task, task.build_model(spec.seed))
        task, model = self._task_model
        training.load_params(model, params)
        return task.evaluate(model)

    async def sample(self, ps: ParamServerClient, min_version: int = 0) -> Sample:
        version, params = await pull_weights(ps, self.job.job_id, min_version)
        metrics = await asyncio.to_thread(self._evaluate, params)
        s = Sample(time.time(), version, metrics["accuracy"], metrics["loss"])
        if not self.samples or self.samples[-1].step != s.step:
            self.samples.append(s)
        return s

    async def run(self) -> None:
        ps = await param_client(self.client, self.job.job_id, self.job.spec)
        try:
            while True:
                try:
                    await self.sample(ps)
                except RpcError:
                    self.errors += 1  # mid-failover: the next round finds the new primary
                await asyncio.sleep(self.interval_s)
        finally:
            await ps.close()
