"""A replica's backup side: the pushes and commits its primary forwards (one call
each, or messages on the replication stream), and whole-job installs. The
servicer's ReplicatePush, ReplicateCommit, ReplicateStream and InstallState are
thin adapters over it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import structlog

from services.paramserver import jobmetrics, reading, replstream
from services.paramserver.job import Entry, JobModel, Reduced
from services.paramserver.runtime import JobHost, JobRuntime
from stalwart import codec, limits
from stalwart.api import paramserver
from stalwart.errors import ErrorKind, StalwartError
from stalwart.offload import off_loop, tensor_bytes

log = structlog.get_logger(__name__)


class BackupSide:
    def __init__(
        self,
        host: JobHost,
        histories: jobmetrics.Histories,
        from_primary: Callable[[int], None],
        instance: str,
    ):
        """``from_primary(epoch)`` raises unless a primary of that epoch may write
        here; ``instance`` is this process, told to the primary (see
        ``BackupLink.answered_from``)."""
        self.host = host
        self.histories = histories
        self.from_primary = from_primary
        self.instance = instance
        # ReplicateStream calls served here: handler task -> its session
        self._sessions: dict[asyncio.Task, replstream.BackupSession] = {}

    # --- forwarded pushes and commits ---------------------------------------------

    async def replicate_push(self, request_iterator) -> None:
        header = await reading.header(request_iterator, "replication header")
        self.from_primary(header.epoch)
        push = header.push
        self.host.job(push.job_id)
        assembler = await reading.tensors(
            request_iterator, push.tensors, self.host.limits, None, push.packed
        )
        await self.stage(header, assembler)

    async def stage(self, header, assembler: codec.ChunkAssembler) -> None:
        """Buffer a push the primary forwarded (ReplicatePush, the Replicate stream),
        or the sum of a step's pushes (``header.summed``)."""
        push = header.push
        job = self.host.job(push.job_id)
        tensors = assembler.finish()
        async with job.lock:
            if header.summed:
                keys = [(p.step, p.slot) for p in header.summed]
                job.model.stage_sum(
                    push.base_version, keys, Reduced.split(tensors, job.model.buffers)
                )
                for summed in header.summed:
                    self.histories.on_push(summed)
            elif job.model.may_hold_forward(push.step, push.slot):
                job.model.stage(push.step, push.slot, assembler.payload_crc32c, tensors)
                self.histories.on_push(push)
            else:
                log.info("forwarded push not held: no commit can name it", job=push.job_id,
                         step=push.step, slot=push.slot, version=job.model.version)  # fmt: skip
            job.staged.notify_all()  # a commit naming this push may be waiting for it

    async def commit(self, request, wait_s: float | None) -> int:
        """Apply a commit the primary sent (ReplicateCommit, the Replicate stream)."""
        job = self.host.jobs.get(request.job_id)
        entries = [Entry.from_proto(e) for e in request.entries]
        if job is None:
            raise StalwartError(ErrorKind.REPLICA_BEHIND, f"backup lacks job {request.job_id}")
        async with job.lock:
            if job.model.version == request.base_version:
                # the primary commits without waiting for the backups' answers to the
                # forwards, so a push it names may still be streaming in here (it
                # sends the commit only to backups it forwarded every push to)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        job.staged.wait_for(lambda: job.model.has_entries(entries)),
                        wait_s or self.host.replicator.ack_timeout_s,
                    )
            if job.model.version != request.base_version or not job.model.has_entries(entries):
                raise StalwartError(
                    ErrorKind.REPLICA_BEHIND,
                    f"backup at version {job.model.version} lacks what version {request.new_version} needs",
                )
            nbytes = tensor_bytes(job.model.params.values())  # backups overlap nothing with it
            version = await off_loop(job.model.apply, entries, nbytes=nbytes)
            await self.host.applied(job)
            job.committed.notify_all()
        return version

    # --- the replication stream ---------------------------------------------------

    async def serve_stream(self, request_iterator, context) -> None:
        """One replication stream (services/paramserver/replstream.py), to its end;
        refused ``LIMIT_EXCEEDED`` past ``limits.MAX_REPLICATION_STREAMS`` open here
        (each holds a call, a task and the pushes staged on it). The primary then
        forwards with unary calls, as to a backup without the stream."""
        limits.check_open(
            "replication streams", len(self._sessions), limits.MAX_REPLICATION_STREAMS,
            "a primary needs one",
        )  # fmt: skip
        session = replstream.BackupSession(
            context, self.from_primary, self.host.limits, self.stage,
            lambda request: self.commit(request, None), self.instance,
        )  # fmt: skip
        task = asyncio.current_task()
        self._sessions[task] = session
        try:
            await session.run(request_iterator)
        finally:
            self._sessions.pop(task, None)

    async def close_streams(self) -> None:
        """At shutdown: the replication streams this replica serves as a backup end
        once their running commits finished (open, they would hold the server's stop
        for its whole grace). Its own streams to its backups stay open: pushes in
        flight here are still replicated and answered within the grace."""
        sessions = dict(self._sessions)
        if sessions:
            await asyncio.gather(*(s.drain() for s in sessions.values()))
        for task in sessions:
            task.cancel()

    # --- installs -----------------------------------------------------------------

    async def install(self, request_iterator) -> paramserver.InstallStateResponse:
        header = await reading.header(request_iterator, "state header")
        self.from_primary(header.epoch)
        held = self.host.jobs.get(header.model.job_id)
        if header.fresh and held is not None and held.model.version > header.version:
            # Taking it would throw away acknowledged steps: the primary lost them.
            raise StalwartError(
                ErrorKind.FAILED_PRECONDITION,
                f"this backup holds job {header.model.job_id!r} at version "
                f"{held.model.version}; the primary's fresh copy is at {header.version}",
                job=header.model.job_id,
            )
        self.host.check_room(header.model)
        assembler = await reading.tensors(request_iterator, header.tensors, self.host.limits)
        tensors = assembler.finish()
        await self.host.faults.before_install(header.model.job_id)  # tests only
        model = await off_loop(JobModel.from_install, header, tensors)
        previous = self.host.jobs.get(model.job_id)
        runtime = JobRuntime(model)
        if previous is not None:  # pushes forwarded meanwhile are still good: CRCs check them
            model.pending.update(previous.model.pending)
            runtime.fingerprint_at = previous.fingerprint_at
            runtime.fingerprint_waiting = previous.fingerprint_waiting
        self.host.jobs[model.job_id] = runtime
        async with runtime.lock:
            await runtime.settle_fingerprints()
        log.info("state installed", job=model.job_id, version=model.version)
        return paramserver.InstallStateResponse(version=model.version, instance=self.instance)
