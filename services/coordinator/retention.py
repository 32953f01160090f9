"""What finished jobs leave behind, bounded: the paramservers keep the models of the
``--keep-finished-models`` jobs that ended last, the leader the records of the
``--keep-finished-jobs`` ones (those with checkpoints excepted).

A job's model (weights, optimizer state, version history) stays on every replica of
its shard groups when the job ends, so that ``stalwart job export`` can pull the final
weights. Nothing used to drop it afterwards: a cluster running job after job (a sweep)
grew each replica by a model and its optimizer state per job until one ran out of
memory, taking the running jobs' primary with it. Job records are small, but a client
creating and cancelling jobs in a loop grew the leader, its listings and what a new
leader loads without end.

What each replica holds comes from the leader's polls (``Control.views``), so nothing
more is stored: a new leader sees the same models and goes on. The decision is the
two plain functions below; :class:`ModelRetention` carries it out about once a
second. :class:`JobRetention` forgets records through :meth:`Control.forget_finished`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import structlog

from services.coordinator.control import Control
from services.coordinator.paramwatch import ReplicaLinks
from services.coordinator.promotion import ReplicaView
from stalwart.errors import RpcError, StalwartError

log = structlog.get_logger(__name__)

PERIOD_S = 1.0  # seconds between rounds: nothing waits on a finished job's memory
JOBS_PER_ROUND = 500  # records looked at per round (each a read of the checkpoint store)


@dataclass(frozen=True)
class Delete:
    """One DeleteModel to send: ``job_id`` off the replica at ``address``."""

    address: str
    job_id: str
    epoch: int


def to_release(held: Iterable[str], ended_at: Mapping[str, float], keep: int) -> list[str]:
    """The jobs among ``held`` whose models go: finished ones (``ended_at``: job id ->
    when it ended) except the ``keep`` that ended last. A job not in ``ended_at`` (still
    running, or unknown to the leader) is never named."""
    ended = sorted((ended_at[j], j) for j in set(held) if j in ended_at)
    return sorted(j for _, j in ended[: max(0, len(ended) - keep)])


def deletions(replicas: Sequence[tuple[ReplicaView, int]], release: Iterable[str]) -> list[Delete]:
    """The calls that drop ``release`` from ``replicas`` ((view, shard) pairs): to a
    primary holding the job (it forwards the delete to its backups), and to a backup
    still holding it only when its group's primary no longer does (a forward that was
    refused or missed). Fenced and unconfigured replicas are left alone: they are
    installed afresh before they serve again."""
    release = set(release)
    on_primary = {(shard, j) for v, shard in replicas if v.role == "primary" for j in v.versions}
    out = []
    for view, shard in replicas:
        for job_id in sorted(release & view.versions.keys()):
            if view.role == "primary" or (
                view.role == "backup" and (shard, job_id) not in on_primary
            ):
                out.append(Delete(view.address, job_id, view.epoch))
    return out


class ModelRetention:
    """Sends the deletions each round calls for; one that fails is sent again at the
    next round, since the replica's poll still lists the job."""

    def __init__(self, control: Control, links: ReplicaLinks, keep: int) -> None:
        self.control = control
        self.links = links
        self.keep = keep

    async def round(self) -> None:
        c = self.control
        async with c.lock:
            c.require_leader()
            nodes = c.members.nodes
            replicas = [(v, nodes[v.node_id].shard) for v in c.views.values()
                        if v.node_id in nodes and nodes[v.node_id].leased]  # fmt: skip
            held = {j for v, _ in replicas for j in v.versions}
            ended_at = {j: c.jobs[j].updated_at for j in held if j in c.jobs and c.jobs[j].finished}
            calls = deletions(replicas, to_release(held, ended_at, self.keep))
        if not calls:
            return
        answers = await asyncio.gather(*(self.links.delete_model(d.address, d.job_id, d.epoch)
                                         for d in calls), return_exceptions=True)  # fmt: skip
        for d, answer in zip(calls, answers, strict=True):
            if isinstance(answer, RpcError | StalwartError):
                log.warning("finished job's model not released; next round tries again",
                            job=d.job_id, replica=d.address, error=str(answer))  # fmt: skip
            elif isinstance(answer, BaseException):
                raise answer
            else:
                log.info("finished job's model released", job=d.job_id, replica=d.address,
                         keep=self.keep)  # fmt: skip


class JobRetention:
    """Forgets the records of the finished jobs past ``--keep-finished-jobs``
    (:meth:`Control.oldest_finished`), except those with checkpoints in the store, kept
    for good: exporting a checkpoint needs its job's spec, and the store's chunk
    collection counts only known jobs' checkpoints as references to shared chunks."""

    def __init__(self, control: Control) -> None:
        self.control = control

    async def round(self) -> None:
        c = self.control
        async with c.lock:
            c.require_leader()
            candidates = c.oldest_finished()[:JOBS_PER_ROUND]
        if not candidates:
            return
        forget, keep = await self._split(candidates)
        async with c.lock:
            c.require_leader()
            c.forget_finished(forget, keep)
            await c._flush()
        if forget:
            log.info("finished jobs forgotten", count=len(forget), first=forget[:5],
                     kept_for_checkpoints=len(keep))  # fmt: skip

    async def _split(self, job_ids: list[str]) -> tuple[list[str], list[str]]:
        """(without checkpoints, with checkpoints); one the store cannot tell about now
        is in neither, and asked again next round."""
        checkpoints = self.control.checkpoints
        if checkpoints is None:
            return job_ids, []
        forget, keep = [], []
        for job_id in job_ids:
            try:
                (keep if await checkpoints.list(job_id) else forget).append(job_id)
            except StalwartError as exc:
                log.warning("checkpoint store unreadable; job record kept", job=job_id,
                            error=str(exc))  # fmt: skip
                break
        return forget, keep
