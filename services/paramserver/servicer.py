"""gRPC adapter of the parameter server: reads requests, checks them, and hands
the work to JobHost (services/paramserver/runtime.py), whose commit path runs
the state machines of services/paramserver/commit.py. Torch work runs off the
event loop."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import uuid
from collections.abc import Awaitable, Callable

import grpc
import structlog

from services.paramserver import (
    checkpointing,
    commit,
    jobmetrics,
    metrics,
    phases,
    pushstreams,
    reading,
    replstream,
)
from services.paramserver.backupside import BackupSide
from services.paramserver.consistency import Verdict
from services.paramserver.faults import Faults
from services.paramserver.job import JobModel, check_finite, combined_fingerprint
from services.paramserver.replica import Check, ReplicaState, Role
from services.paramserver.replicator import Fenced, Replicator
from services.paramserver.runtime import JobHost, JobRuntime
from stalwart import codec
from stalwart.api import common, paramserver, paramserver_grpc
from stalwart.checkpoint import MIN_CHUNK_BYTES
from stalwart.errors import ErrorKind, StalwartError
from stalwart.offload import off_loop as _off_loop
from stalwart.offload import tensor_bytes
from stalwart.server import drain_on_refusal, rpc_handler

log = structlog.get_logger(__name__)

# how long a commit or a duplicate's answer waits for backups being installed
SYNC_WAIT_S = 2.0

_ROLES = {
    Role.PRIMARY: common.REPLICA_ROLE_PRIMARY,
    Role.BACKUP: common.REPLICA_ROLE_BACKUP,
    Role.FENCED: common.REPLICA_ROLE_FENCED,
}


class ParamServer(paramserver_grpc.ParamServerServiceServicer):
    def __init__(
        self,
        replica: ReplicaState,
        replicator: Replicator,
        node_id: str,
        shard: int,
        limits: codec.Limits,
        chunk_bytes: int,
        sync_wait_s: float,
        on_role_change=None,
        faults: Faults | None = None,
        memory_budget: int = 0,
    ):
        self.host = JobHost(replica, replicator, shard, limits, sync_wait_s,
                            on_role_change or (lambda role: None), faults or Faults(),
                            memory_budget=memory_budget)  # fmt: skip
        self.node_id = node_id
        self.chunk_bytes = chunk_bytes
        self.histories = jobmetrics.Histories()  # losses and evaluations (ListJobMetrics)
        # job_id -> its committed steps on the coordinator's books, None if it never
        # admitted the job; unset, the replica runs standalone (no check)
        self.committed_step: Callable[[str], Awaitable[int | None]] | None = None
        # Drawn once per process: the coordinator tells a restarted replica by it.
        self.instance = uuid.uuid4().hex
        self.backup_side = BackupSide(self.host, self.histories, self._from_primary, self.instance)
        self.push_streams = pushstreams.PushStreams()

    # the host's parts, as the launcher and the metrics read them
    replica = property(lambda self: self.host.replica)
    replicator = property(lambda self: self.host.replicator)
    jobs = property(lambda self: self.host.jobs)
    shard = property(lambda self: self.host.shard)
    limits = property(lambda self: self.host.limits)
    sync_wait_s = property(lambda self: self.host.sync_wait_s)
    faults = property(lambda self: self.host.faults)

    @property
    def on_role_change(self):
        return self.host.on_role_change

    @on_role_change.setter
    def on_role_change(self, fn) -> None:
        self.host.on_role_change = fn

    # --- shared checks -----------------------------------------------------------

    def _raise_check(self, check: Check, got: int) -> None:
        self.host.raise_check(check, got)

    def _client(self, epoch: int) -> None:
        self.host.check_client(epoch)

    def _from_primary(self, epoch: int) -> None:
        before = self.replica.role
        self._raise_check(self.replica.check_from_primary(epoch), epoch)
        if self.replica.role is not before:
            self.on_role_change(self.replica.role)

    def _job(self, job_id: str) -> JobRuntime:
        return self.host.job(job_id)

    # --- registration -----------------------------------------------------------

    @drain_on_refusal
    async def RegisterModel(self, request_iterator, context):
        header = await reading.header(request_iterator, "model header")
        self._client(header.epoch)
        if not header.job_id:
            raise StalwartError(ErrorKind.INVALID_ARGUMENT, "job_id is empty")
        if header.job_id not in self.jobs:  # checked before a byte of the model is read
            await self._check_fresh(header.job_id)
            self.host.check_room(header)
        assembler = await reading.tensors(request_iterator, header.tensors, self.limits)
        tensors = assembler.finish()
        existing = self.jobs.get(header.job_id)
        if existing is not None:
            return await self._re_register(existing, header, tensors)
        model = await _off_loop(JobModel, header, tensors)
        job = self.jobs[header.job_id] = JobRuntime(model, fresh=True)
        log.info(
            "model registered", job=header.job_id, tensors=len(tensors), bytes=model.state_bytes()
        )
        async with job.lock:
            await self.host.install_everywhere(job)
        return paramserver.RegisterModelResponse(version=0)

    async def _check_fresh(self, job_id: str) -> None:
        """A model this replica does not hold is taken only for a job the coordinator
        admitted and that has no committed step yet. With committed steps, the job's
        state lives on a backup or in a checkpoint; this replica lost it (it restarted)
        or never had it, and fresh weights here (copied to its backups too) would
        throw the acknowledged steps away. The coordinator moves the group to a
        replica that holds them."""
        if self.committed_step is None:
            return
        step = await self.committed_step(job_id)
        if step is None:
            raise StalwartError(
                ErrorKind.UNKNOWN_JOB,
                f"job {job_id!r} was never admitted by the coordinator; submit it first",
                job=job_id,
            )
        if step > 0:
            raise StalwartError(
                ErrorKind.FAILED_PRECONDITION,
                f"job {job_id!r} has {step} committed steps that this replica does not hold; "
                "it takes the job's state from its group, not fresh weights",
                job=job_id,
            )

    async def _re_register(
        self, job: JobRuntime, header, tensors
    ) -> paramserver.RegisterModelResponse:
        if _model_identity(header) != _model_identity(job.model.header):
            raise StalwartError(
                ErrorKind.ALREADY_EXISTS, f"job {header.job_id} is registered with another model"
            )
        async with job.lock:
            await self.host.install_everywhere(job)
        return paramserver.RegisterModelResponse(version=job.model.version, already_registered=True)

    # --- push ------------------------------------------------------------------

    @drain_on_refusal
    async def Push(self, request_iterator, context):
        return await self._answer(*await self._push(request_iterator, context))

    @rpc_handler
    async def PushStream(self, request_iterator, context):
        """Pushes one after another on one call, each answered before the next is read.
        A refusal ends the call with its status, once the rest of the refused push is
        read (as Push's refusals are)."""
        with self.push_streams.track(context) as stream:
            while not stream.closing:
                first = await stream.next_message()  # aborted here at shutdown
                if first is grpc.aio.EOF:
                    return
                push = pushstreams.OnePush(first, context)
                try:
                    answer = await self._answer(*await self._push(push, context, True))
                except StalwartError:
                    await push.drain()  # so that the refusal's status arrives intact
                    raise
                # PushStreamResponse is laid out as PushResponse: its bytes go as they are
                await context.write(
                    answer if isinstance(answer, bytes) else answer.SerializeToString()
                )

    async def _answer(self, job: JobRuntime, header, response):
        """``response``, carrying the parameters too when the header asks for them."""
        if not header.answer_parameters_bytes:
            return response
        limit = min(
            header.answer_parameters_bytes, self.chunk_bytes + codec.PUSH_ANSWER_SLACK_BYTES
        )
        return await phases.timed(
            "answer", self._with_parameters(job, header.base_version, limit, response)
        )

    @metrics.counted_push
    async def _push(self, request_iterator, context, one_of_many: bool = False):
        """Read, forward and admit one push: (its job, its header, the answer).
        ``one_of_many``: more pushes follow on the stream, so reading stops at this
        one's last chunk instead of at the end of the stream."""
        header = await reading.header(request_iterator, "push header")
        received = time.perf_counter()
        self._client(header.epoch)
        job = self._job(header.job_id)
        structlog.contextvars.bind_contextvars(
            job=header.job_id, step=header.step, slot=header.slot
        )
        job.model.check_slot(header.step, header.slot)
        job.model.check_grad_specs(header.tensors)
        # a synchronous step's pushes reach the backups summed, once (runtime.JobHost.commit)
        forwards = [] if job.model.forwards_sums else self.replicator.open_forwards(header)
        try:
            await self.replicator.forward_header(forwards, header)

            async def forward(chunk, placed):
                # the message as received (the backup checks its bytes against the
                # sender's CRC32C); one parsed by protobuf is serialized again, once,
                # straight from where the chunk landed
                if isinstance(chunk, codec.WireChunk):
                    message = chunk.message
                else:
                    message = codec.chunk_message(
                        chunk.tensor_index, chunk.offset, placed, chunk.crc32c
                    )
                await self.replicator.forward_chunk(forwards, message)

            # nothing to forward to (a sync step's sum goes later, or no backup is in
            # sync): no chunk message is rebuilt and no empty write awaited per chunk
            assembler = await reading.tensors(
                request_iterator, header.tensors, self.limits, forward if forwards else None,
                header.packed, until_complete=one_of_many,
            )  # fmt: skip
            grads = assembler.finish()
            await _off_loop(check_finite, grads, nbytes=tensor_bytes(grads.values()))
        except BaseException:
            self.replicator.cancel_forwards(forwards)
            raise
        # The backups' answers to the forward are not waited for here: the push is
        # staged at once and a commit that names it waits for its forward before
        # applying here (runtime.JobHost.commit), while the backups apply as soon
        # as they hold it; the commit's round trip overlaps the forward's answer.
        key = (header.step, header.slot)
        forwarded = asyncio.ensure_future(self.replicator.finish_forwards(header.job_id, forwards))
        job.forwarding[key] = (forwarded, frozenset(f.address for f in forwards))
        phases.observe("receive", received)
        try:
            response = await self._admit(job, header, assembler.payload_crc32c, grads, context)
        finally:
            # not cancelled even if the push failed here: the push may be staged (a
            # retry finds it), and its backups must hold it too (bounded by the ack timeout)
            await asyncio.wait({forwarded})
            if job.forwarding.get(key, (None,))[0] is forwarded:
                del job.forwarding[key]
        try:
            forwarded.result()
        except Fenced as exc:
            raise self.host.fenced(exc) from None
        return job, header, response

    async def _with_parameters(self, job: JobRuntime, since: int, limit: int, response):
        """The answer with the parameters changed since ``since`` at its version, as a
        Pull would stream them (the same cached chunks), when that version is still
        the readable one and they fit in ``limit`` bytes; otherwise the answer as it
        is, and the caller pulls."""
        async with job.lock:
            if job.model.version != response.version or not self._readable(job, response.version):
                return response
            header, chunks = await self._snapshot(job, since, self.chunk_bytes, packed=True)
        head = paramserver.PullResponse(header=header).SerializeToString()
        if len(head) + sum(map(len, chunks)) > limit:
            return response
        return codec.push_answer(response, [head, *chunks])

    async def _admit(self, job: JobRuntime, header, crc: int, grads, context):
        deadline = asyncio.get_running_loop().time() + (
            context.time_remaining() or self.sync_wait_s
        )
        async with job.lock:
            while True:
                # again after every wait: configured as a backup meanwhile (the group
                # failed over under it), this replica must neither apply nor answer
                self._client(header.epoch)
                verdict = job.model.judge(header.step, header.slot, header.base_version, crc)
                if verdict is not Verdict.WAIT:
                    break
                remaining = deadline - asyncio.get_running_loop().time()
                try:
                    await asyncio.wait_for(job.committed.wait(), max(remaining, 0))
                except TimeoutError:
                    raise StalwartError(
                        ErrorKind.DEADLINE_EXCEEDED, "staleness bound still holds the push"
                    ) from None
            self._raise_verdict(verdict, job, header)
            entries = None
            if verdict is Verdict.ACCEPT:
                job.model.stage(header.step, header.slot, crc, grads)
                self.histories.on_push(header)
                if job.model.forwards_sums:
                    bare = paramserver.PushHeader()
                    bare.CopyFrom(header)
                    bare.ClearField("tensors")
                    job.summed_pushes[(header.step, header.slot)] = bare
                entries = job.model.ready_entries(header.step, header.slot)
            if verdict is Verdict.DUPLICATE or entries is not None:
                await self._backups_in_sync(job, deadline)
                self._client(header.epoch)
            action = commit.on_push(
                verdict, entries is not None, job.model.version,
                len(self.replicator.synced(job.model.job_id)), self.replicator.required(),
            )  # fmt: skip
            if isinstance(action, commit.Refuse):
                raise StalwartError(
                    ErrorKind.NO_INSYNC_BACKUP,
                    f"{action.have} of the {action.need} required backups hold job "
                    f"{header.job_id}; not acknowledged, retry",
                )
            if isinstance(action, commit.Acknowledge):
                return paramserver.PushResponse(version=action.version, duplicate=True)
            if isinstance(action, commit.StartCommit):
                phases.PHASE_SECONDS.labels("wait_slots").observe(0.0)
                version = await phases.timed("commit", self.host.commit(job, entries))
                return paramserver.PushResponse(version=version)
            waiter = job.future_for(header.step)
        staged = time.perf_counter()
        try:
            version = await asyncio.wait_for(
                asyncio.shield(waiter), max(deadline - asyncio.get_running_loop().time(), 0)
            )
        except TimeoutError:
            raise StalwartError(
                ErrorKind.DEADLINE_EXCEEDED,
                f"step {header.step} is still waiting for other slots; the push is kept, retry",
            ) from None
        phases.observe("wait_slots", staged)
        return paramserver.PushResponse(version=version)

    async def _backups_in_sync(self, job: JobRuntime, deadline: float) -> None:
        """Before a commit or a duplicate's answer (job lock held, released while
        waiting): wait a little for enough backups to hold the job. A promoted
        primary's new backup is installed within a second; refusing meanwhile
        sent every trainer into its retry backoff and added a second or more to
        the recovery. One that does not come in time is refused as before."""
        model = job.model
        # half what the caller has left, so a refusal still reaches it in time
        wait_s = min((deadline - asyncio.get_running_loop().time()) / 2, SYNC_WAIT_S)
        if self.replicator.holds_enough(model.job_id) or wait_s <= 0:
            return
        with contextlib.suppress(TimeoutError):
            enough = functools.partial(self.replicator.holds_enough, model.job_id)
            await asyncio.wait_for(job.committed.wait_for(enough), wait_s)
        if job.model is not model:  # restored meanwhile: this push's base is gone
            raise StalwartError(ErrorKind.TOO_STALE, "the job's state was replaced; pull")

    def _raise_verdict(self, verdict: Verdict, job: JobRuntime, header) -> None:
        m = job.model
        messages = {
            Verdict.CONFLICT: (
                ErrorKind.CONFLICTING_PUSH,
                f"step {header.step} slot {header.slot} was applied with different bytes",
            ),
            Verdict.AHEAD: (
                ErrorKind.INVALID_ARGUMENT,
                f"step {header.step} is ahead of slot {header.slot} (expected {m.version if m.rules.mode.value == 'sync' else m.clocks[header.slot]})",
            ),
            Verdict.STALE_BASE: (
                ErrorKind.TOO_STALE,
                f"gradient computed from version {header.base_version}, parameters are at {m.version}; pull and recompute",
            ),
            Verdict.TOO_STALE: (
                ErrorKind.TOO_STALE,
                f"slot {header.slot} is more than {m.rules.staleness} steps ahead of the slowest slot",
            ),
        }
        if verdict in messages:
            kind, text = messages[verdict]
            extra = {}
            if verdict is Verdict.AHEAD and m.rules.mode.value != "sync":
                # the slot's count of applied pushes: where a trainer that took over
                # an async or ssp slot goes on from (services/trainer/worker.py)
                extra["expected_step"] = m.clocks[header.slot]
            raise StalwartError(kind, text, job=header.job_id, **extra)

    # --- pull ------------------------------------------------------------------

    @rpc_handler
    async def Pull(self, request, context):
        self._client(request.epoch)
        job = self._job(request.job_id)
        if request.optimizer_state and request.since_version != -1:
            raise StalwartError(
                ErrorKind.INVALID_ARGUMENT, "optimizer_state needs since_version -1 (everything)"
            )
        chunk_bytes = _pull_chunk_bytes(request.chunk_size, self.chunk_bytes)
        timeout = context.time_remaining() or self.sync_wait_s
        async with job.lock:
            try:
                await asyncio.wait_for(
                    job.committed.wait_for(lambda: self._readable(job, request.min_version)),
                    timeout,
                )
            except TimeoutError:
                raise StalwartError(
                    ErrorKind.DEADLINE_EXCEEDED,
                    f"version {request.min_version} not reached (at {job.model.version})",
                ) from None
            if request.optimizer_state:
                header, chunks = await self._encode(
                    job, job.model.state_tensors(), chunk_bytes, request.packed
                )
            else:
                header, chunks = await self._snapshot(
                    job, request.since_version, chunk_bytes, request.packed
                )
        yield paramserver.PullResponse(header=header)
        for chunk in chunks:
            yield chunk  # a serialized PullResponse (see add_to_server)

    def _readable(self, job: JobRuntime, min_version: int) -> bool:
        # Serve only acknowledged state: after a commit the backups refused, the
        # update is applied here but held by no backup yet, and a reader must not
        # see a version that a failover could take back. In-sync backups are
        # always at this replica's version, so enough of them means durable.
        return job.model.version >= min_version and self.replicator.holds_enough(job.model.job_id)

    async def _snapshot(self, job: JobRuntime, since: int, chunk_bytes: int, packed: bool):
        """Serialized chunk messages of the changed tensors at the current version, cached."""
        names = tuple(job.model.changed_since(since))
        key = (job.model.version, names, chunk_bytes, packed)
        if job.pull_cache is not None and job.pull_cache[0] == key:
            return job.pull_cache[1], job.pull_cache[2]
        header, chunks = await self._encode(
            job, {n: job.model.params[n] for n in names}, chunk_bytes, packed
        )
        job.pull_cache = (key, header, chunks)
        return header, chunks

    async def _encode(self, job: JobRuntime, tensors: dict, chunk_bytes: int, packed: bool):
        """Header and serialized chunk messages of ``tensors`` at the current version."""
        values = list(tensors.values())
        chunks = await _off_loop(
            lambda: list(codec.encode_chunk_messages(values, chunk_bytes, packed))
        )
        header = paramserver.PullHeader(
            version=job.model.version,
            tensors=[codec.spec_of(n, t) for n, t in tensors.items()],
            epoch=self.replica.epoch,
            packed=packed,
        )
        return header, chunks

    # --- inspection and control -------------------------------------------------

    @rpc_handler
    async def GetFingerprint(self, request, context):
        job = self._job(request.job_id)
        at = request.at_version
        if at < 0:
            raise StalwartError(ErrorKind.INVALID_ARGUMENT, "at_version must be >= 0")
        async with job.lock:
            version = job.model.version
            if at and version > at:
                raise StalwartError(
                    ErrorKind.FAILED_PRECONDITION, f"already at version {version}, past {at}"
                )
            if not at or version == at:
                prints = await _off_loop(job.model.fingerprints)
            else:
                mark = job.fingerprint_mark(at)
        if at and version < at:
            timeout = context.time_remaining() or self.sync_wait_s
            try:
                prints = await asyncio.wait_for(asyncio.shield(mark), timeout)
            except TimeoutError:
                raise StalwartError(
                    ErrorKind.DEADLINE_EXCEEDED, f"version {at} not reached in time"
                ) from None
            finally:
                job.release_fingerprint_mark(at, mark)
            version = at
        return paramserver.GetFingerprintResponse(
            version=version,
            epoch=self.replica.epoch,
            combined=combined_fingerprint(prints),
            tensors=prints,
        )

    @rpc_handler
    async def GetReplicaStatus(self, request, context):
        return paramserver.GetReplicaStatusResponse(
            node_id=self.node_id,
            role=_ROLES[self.replica.role],
            epoch=self.replica.epoch,
            shard=self.shard,
            instance=self.instance,
            jobs=[self._job_status(j) for j in self.jobs.values()],
            backups=[
                paramserver.BackupStatus(
                    address=a,
                    in_sync=set(self.jobs) <= link.synced_jobs,
                    last_error=link.last_error,
                    streaming=self.replicator.streaming(a),
                )
                for a, link in self.replica.backups.items()
            ],
        )

    @staticmethod
    def _job_status(job: JobRuntime) -> paramserver.ReplicaJob:
        m = job.model
        return paramserver.ReplicaJob(
            job_id=m.job_id,
            version=m.version,
            num_slots=m.rules.num_slots,
            mode=m.header.consistency.mode,
            state_bytes=m.state_bytes(),
            pushed_slots=m.pushed_slots(),
        )

    @rpc_handler
    async def Promote(self, request, context):
        was_primary = self.replica.role is Role.PRIMARY
        check = self.replica.promote(
            request.epoch, list(request.backups), request.coordinator_epoch
        )
        self._raise_check(check, request.epoch)
        for job in self.jobs.values():
            if not was_primary:  # clients re-push whatever was not acknowledged
                job.model.pending.clear()
            # Promoted again (above a stray claim), the pushes staged here are its own,
            # admitted ones: a commit under way applies them, and staged slots of a
            # sync step wait for the others. Cleared, that commit failed (KeyError) and
            # the waiting slots stood still until their deadline.
            job.pull_cache = None
        log.warning("promoted to primary", epoch=request.epoch, backups=list(request.backups))
        self.on_role_change(self.replica.role)
        return paramserver.PromoteResponse(
            epoch=self.replica.epoch, jobs=[self._job_status(j) for j in self.jobs.values()]
        )

    @rpc_handler
    async def ConfigureReplica(self, request, context):
        roles = {common.REPLICA_ROLE_PRIMARY: Role.PRIMARY, common.REPLICA_ROLE_BACKUP: Role.BACKUP}
        role = roles.get(request.role)
        if role is None:
            raise StalwartError(ErrorKind.INVALID_ARGUMENT, "role must be PRIMARY or BACKUP")
        self._raise_check(
            self.replica.configure(
                role, request.epoch, list(request.backups), request.coordinator_epoch
            ),
            request.epoch,
        )
        self.on_role_change(self.replica.role)
        return paramserver.ConfigureReplicaResponse(
            role=_ROLES[self.replica.role], epoch=self.replica.epoch
        )

    @rpc_handler
    async def DeleteModel(self, request, context):
        if self.replica.role is Role.PRIMARY:
            self._client(request.epoch)
        else:
            self._from_primary(request.epoch)
        # gone here first: while the backups' deletes were awaited, the resync loop saw
        # a backup already cleared as out of sync and installed the job there again
        deleted = self.jobs.pop(request.job_id, None) is not None
        self.histories.jobs.pop(request.job_id, None)
        checkpointing.forget(request.job_id)
        if self.replica.role is Role.PRIMARY:
            await self.replicator.delete(request.job_id)
        return paramserver.DeleteModelResponse(deleted=deleted)

    # --- checkpoints (services/paramserver/checkpointing.py) ----------------------

    @rpc_handler
    @metrics.counted_save
    async def SaveCheckpoint(self, request, context):
        return await checkpointing.save(self.host, request, context)

    @rpc_handler
    async def LoadCheckpoint(self, request, context):
        return await checkpointing.load(self.host, request, context)

    # --- metrics (services/paramserver/jobmetrics.py) ---------------------------

    @rpc_handler
    async def RecordEvaluation(self, request, context):
        return await jobmetrics.record(self, request)

    @rpc_handler
    async def ListJobMetrics(self, request, context):
        return jobmetrics.list_metrics(self, request)

    # --- backup side (services/paramserver/backupside.py) -----------------------

    @drain_on_refusal
    async def ReplicatePush(self, request_iterator, context):
        await self.backup_side.replicate_push(request_iterator)
        return paramserver.ReplicatePushResponse()

    @rpc_handler
    async def ReplicateCommit(self, request, context):
        self._from_primary(request.epoch)
        version = await self.backup_side.commit(request, context.time_remaining())
        return paramserver.ReplicateCommitResponse(version=version)

    @rpc_handler
    async def ReplicateStream(self, request_iterator, context):
        """The replication stream (services/paramserver/replstream.py)."""
        await self.backup_side.serve_stream(request_iterator, context)

    async def close_streams(self) -> None:
        await self.push_streams.close()
        await self.backup_side.close_streams()

    @drain_on_refusal
    async def InstallState(self, request_iterator, context):
        return await self.backup_side.install(request_iterator)

    # --- background -------------------------------------------------------------

    async def resync_forever(self, interval_s: float = 0.2) -> None:
        """Re-install jobs on backups that fell out of sync, while primary."""
        while True:
            await asyncio.sleep(interval_s)
            if self.replica.role is not Role.PRIMARY:
                continue
            self.replicator.keep_streams_open()
            for job in list(self.jobs.values()):
                for address in list(self.replica.backups):
                    if address in self.replicator.synced(job.model.job_id):
                        continue
                    if not await self.replicator.answers(address):
                        continue  # hung or gone: try again next round, outside the lock
                    async with job.lock:
                        if self.jobs.get(job.model.job_id) is not job:
                            break  # deleted (or replaced) meanwhile: nothing to install
                        if address in self.replicator.synced(job.model.job_id):
                            continue  # a commit or registration synced it meanwhile
                        try:
                            await self.host.install(job, address)
                        except StalwartError:
                            break


# Calls whose request stream is a header and then chunks (PushStream: one such run
# after another).
_CHUNK_STREAMS = ("RegisterModel", "Push", "PushStream", "ReplicatePush", "InstallState")


def add_to_server(servicer: ParamServer, server) -> None:
    """Register the servicer like the generated ``add_..._to_server``, except that
    Pull's and Push's serializers also send messages already serialized: the cached
    chunks (``bytes`` from :func:`codec.encode_chunk_messages`), without a copy per
    pull, and a push's answer with parameters (:func:`codec.push_answer`);
    and the chunk streams' chunks are read by :func:`codec.read_chunk_message`,
    without protobuf's copies of their data (a push's chunks go on to the
    backups as they came), the replication stream's by
    :func:`replstream.request_reader`."""

    class _Capture:
        def __init__(self):
            self.service = ""
            self.handlers: dict = {}

        def add_generic_rpc_handlers(self, handlers) -> None:
            pass

        def add_registered_method_handlers(self, service, handlers) -> None:
            self.service, self.handlers = service, dict(handlers)

    capture = _Capture()
    paramserver_grpc.add_ParamServerServiceServicer_to_server(servicer, capture)
    handlers = capture.handlers
    for name in ("Pull", "Push", "PushStream"):  # pushes: answers carrying parameters
        handler = handlers[name]
        handlers[name] = handler._replace(
            response_serializer=codec.passthrough(handler.response_serializer)
        )
    for name in _CHUNK_STREAMS:
        handler = handlers[name]
        handlers[name] = handler._replace(
            request_deserializer=codec.chunk_reader(handler.request_deserializer)
        )
    handler = handlers["ReplicateStream"]  # its chunks too, each behind its op
    handlers["ReplicateStream"] = handler._replace(
        request_deserializer=replstream.request_reader(handler.request_deserializer)
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(capture.service, handlers),)
    )
    server.add_registered_method_handlers(capture.service, handlers)


def _pull_chunk_bytes(asked: int, largest: int) -> int:
    """The chunk size a Pull gets: the caller's (0: the server's), at most the server's.

    Each chunk is a message with its own CRC32C and header: chunk_size 1 turned one
    14 MB model into 14 million messages, encoded under the job's lock, and froze
    every step of the job while it ran. So the floor of checkpoint chunks applies."""
    if 0 < asked < MIN_CHUNK_BYTES:
        raise StalwartError(
            ErrorKind.INVALID_ARGUMENT,
            f"chunk_size must be 0 (the server's, {largest} bytes) or at least "
            f"{MIN_CHUNK_BYTES} bytes, got {asked}",
        )
    return min(asked or largest, largest)


def _model_identity(header: paramserver.ModelHeader) -> bytes:
    """What makes two registrations the same model: not the sender's epoch or chunk
    size (a trainer re-registers after a failover or a restore from a checkpoint,
    whose header carries another epoch and no chunk size)."""
    same = paramserver.ModelHeader()
    same.CopyFrom(header)
    same.ClearField("epoch")
    same.ClearField("chunk_size")
    return same.SerializeToString(deterministic=True)
