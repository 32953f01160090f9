"""Primary-side replication: forwards pushes to backups as they stream in,
commits steps on them, and installs full state on backups that fell behind.

The primary answers a client only after every backup in sync for the job has
applied the update (and at least ``min_insync`` of the configured ones did).
A backup that fails a call, or does not acknowledge within ``ack_timeout_s``
(hung, paused, starved), drops out of sync for that job, so the step goes on
with the backups that remain in sync; with fewer than ``min_insync`` left the
push is refused (consistency over availability). The resync loop re-installs
a dropped backup's state under the job's lock once it answers again, after
which it follows again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import grpc
import structlog
import torch

from services.paramserver import commit, replstream
from services.paramserver.job import Entry
from services.paramserver.replica import ReplicaState
from stalwart import codec
from stalwart.api import paramserver, paramserver_grpc
from stalwart.errors import ErrorKind, RpcError

log = structlog.get_logger(__name__)

# Longest a whole state transfer to one backup may take (a large model is many chunks).
REPLICATION_TIMEOUT_S = 60.0
DEFAULT_ACK_TIMEOUT_S = 1.0


class Fenced(Exception):
    """A backup knows a higher epoch: this primary is deposed."""


class ForwardStream:
    """One push being forwarded to one backup while it streams in."""

    def __init__(self, address: str, call: grpc.aio.StreamUnaryCall, ack_timeout_s: float):
        self.address = address
        self.call = call
        self.ack_timeout_s = ack_timeout_s
        self.error: str = ""

    async def write(self, message: paramserver.ReplicatePushRequest) -> None:
        if self.error:
            return
        try:
            # a hung backup stops reading: its flow-control window fills and the
            # write would block the whole push
            await asyncio.wait_for(self.call.write(message), self.ack_timeout_s)
        except TimeoutError:
            self.error = f"backup took no data for {self.ack_timeout_s} s"
            self.call.cancel()
        except (grpc.RpcError, grpc.aio.UsageError, asyncio.InvalidStateError) as exc:
            # The call ended under us: the backup went away, or it answered
            # early (it refuses a stale epoch at the header). A late write then
            # fails with "RPC already finished" (which used to escape as
            # INTERNAL) or "Internal error from Core", the backup's reason
            # lost: finish_forwards asks the backup its epoch.
            self.error = str(exc) or "write failed"

    async def finish(self) -> RpcError | None:
        if self.error:
            self.call.cancel()
            return RpcError(grpc.StatusCode.UNAVAILABLE, self.error)
        try:
            await asyncio.wait_for(self._done(), self.ack_timeout_s)
            return None
        except TimeoutError:
            self.call.cancel()
            return RpcError(grpc.StatusCode.DEADLINE_EXCEEDED,
                            f"backup did not acknowledge within {self.ack_timeout_s} s")  # fmt: skip
        except grpc.RpcError as exc:
            return RpcError.from_grpc(exc)

    async def _done(self) -> None:
        await self.call.done_writing()
        await self.call

    def cancel(self) -> None:
        self.call.cancel()


class Replicator:
    def __init__(
        self,
        replica: ReplicaState,
        stub_for: Callable[[str], paramserver_grpc.ParamServerServiceStub],
        min_insync: int,
        chunk_bytes: int,
        ack_timeout_s: float = DEFAULT_ACK_TIMEOUT_S,
        use_streams: bool = True,
    ):
        self.replica = replica
        self._stub_for = stub_for
        self.min_insync = min_insync
        self.chunk_bytes = chunk_bytes
        self.ack_timeout_s = ack_timeout_s
        # (backup address, job) -> the version that backup last confirmed holding;
        # read by the replication lag gauge (services/paramserver/metrics.py).
        self.acked: dict[tuple[str, str], int] = {}
        # backup address -> the replication stream to it (services/paramserver/replstream.py)
        self.links: dict[str, replstream.StreamLink] = {}
        self.use_streams = use_streams

    # --- which backups hold which job -------------------------------------------

    def synced(self, job_id: str) -> list[str]:
        return [a for a, link in self.replica.backups.items() if job_id in link.synced_jobs]

    def required(self) -> int:
        return min(self.min_insync, len(self.replica.backups))

    def holds_enough(self, job_id: str) -> bool:
        """Whether enough backups are in sync for ``job_id`` to acknowledge its updates."""
        return len(self.synced(job_id)) >= self.required()

    def drop(self, address: str, job_id: str, error: str) -> None:
        link = self.replica.backups.get(address)
        if link is not None:
            link.synced_jobs.discard(job_id)
            link.last_error = error
            log.warning("backup out of sync", backup=address, job=job_id, error=error)

    async def _check_fenced(self, address: str, err: RpcError) -> None:
        """Fence this replica when a backup refused it for its epoch and is above it
        now (the refusal may date from before this replica was promoted again:
        commit.EpochRefused)."""
        if err.kind not in (ErrorKind.STALE_EPOCH, ErrorKind.FENCED):
            return
        epoch = await self.epoch_of(address)
        if epoch is not None and epoch > self.replica.epoch:
            self.replica.fence()
            raise Fenced(f"{err.message} (backup {address} is at epoch {epoch})")

    # --- forwarding and committing ----------------------------------------------

    def _stream_to(self, address: str) -> tuple[replstream.StreamLink, object] | None:
        """The open replication stream to a backup (None: use the unary calls; the
        stream is opened meanwhile, see replstream.StreamLink)."""
        if not self.use_streams:
            return None
        link = self.links.get(address)
        if link is None:
            for gone in [a for a in self.links if a not in self.replica.backups]:
                self.links.pop(gone).close()
            link = self.links[address] = replstream.StreamLink(
                address,
                lambda: self._stub_for(address).ReplicateStream(),
                lambda: self.replica.epoch,
                self.ack_timeout_s,
                lambda instance: self._answered_from(address, instance),
            )
        call = link.usable()
        return None if call is None else (link, call)

    def keep_streams_open(self) -> None:
        """Open (or reopen, when due) the stream to every backup, jobs idle or not:
        its opening tells a backup restarted under its address (``_answered_from``)."""
        for address in list(self.replica.backups):
            self._stream_to(address)

    def _answered_from(self, address: str, instance: str) -> None:
        link = self.replica.backups.get(address)
        if link is not None and link.answered_from(instance):
            log.warning("backup restarted, its jobs to be installed again",
                        backup=address, instance=instance)  # fmt: skip

    def streaming(self, address: str) -> bool:
        link = self.links.get(address)
        return link is not None and link.ready

    def close(self) -> None:
        for link in self.links.values():
            link.close()
        self.links.clear()

    def open_forwards(
        self, header: paramserver.PushHeader
    ) -> list[ForwardStream | replstream.StreamForward]:
        streams: list[ForwardStream | replstream.StreamForward] = []
        for address in self.synced(header.job_id):
            open_stream = self._stream_to(address)
            if open_stream is not None:
                streams.append(replstream.StreamForward(*open_stream))
                continue
            call = self._stub_for(address).ReplicatePush(timeout=REPLICATION_TIMEOUT_S)
            streams.append(ForwardStream(address, call, self.ack_timeout_s))
        return streams

    async def forward_header(
        self, streams: Sequence[ForwardStream], header: paramserver.PushHeader,
        summed: Sequence[paramserver.PushHeader] = (),
    ):  # fmt: skip
        msg = paramserver.ReplicatePushRequest(
            header=paramserver.ReplicatePushHeader(
                epoch=self.replica.epoch, push=header, summed=summed
            )
        )
        await asyncio.gather(*(s.write(msg) for s in streams))

    def forward_sum(
        self, header: paramserver.PushHeader, summed: Sequence[paramserver.PushHeader],
        tensors: Sequence[torch.Tensor],
    ) -> tuple[asyncio.Future, frozenset[str]]:  # fmt: skip
        """Forward a step's reduced update, as one push naming the pushes ``summed``,
        to every backup in sync: (the forward's end, as ``finish_forwards``, and the
        backups it goes to). The tensors must not change until it ended."""
        streams = self.open_forwards(header)
        if not streams:  # no backup in sync: nothing to encode
            return asyncio.ensure_future(self.finish_forwards(header.job_id, [])), frozenset()

        async def send() -> None:
            try:
                await self.forward_header(streams, header, summed)
                for message in codec.encode_chunk_messages(tensors, self.chunk_bytes, packed=True):
                    await self.forward_chunk(streams, message)
            except BaseException:
                self.cancel_forwards(streams)
                raise
            await self.finish_forwards(header.job_id, streams)

        return asyncio.ensure_future(send()), frozenset(s.address for s in streams)

    async def forward_chunk(self, streams: Sequence[ForwardStream], message: bytes):
        """Forward one chunk, serialized by :func:`codec.chunk_message` (the stubs
        from ``stub_for`` send bytes as they are: ``stalwart.client.ParamServerStub``)."""
        await asyncio.gather(*(s.write(message) for s in streams))

    async def finish_forwards(self, job_id: str, streams: Sequence[ForwardStream]) -> None:
        """Wait for each backup's answer to its forward and perform what a
        :class:`commit.ForwardRound` decides: drop a failed backup, or fence."""
        round_ = commit.ForwardRound([s.address for s in streams])
        errors = await asyncio.gather(*(s.finish() for s in streams))
        actions = []
        for stream, err in zip(streams, errors, strict=True):
            actions += round_.feed(self.commit_event(stream.address, err), self.replica.epoch)
        while actions:
            action = actions.pop(0)
            if isinstance(action, commit.AskEpoch):
                epoch = await self.epoch_of(action.address)
                event = commit.EpochAnswered(action.address, epoch)
                actions += round_.feed(event, self.replica.epoch)
            elif isinstance(action, commit.Drop):
                self.drop(action.address, job_id, action.reason)
            elif isinstance(action, commit.Fence):
                self.replica.fence()
                raise Fenced(action.reason)

    async def epoch_of(self, address: str) -> int | None:
        """The backup's epoch, or None when it does not answer within the ack timeout."""
        try:
            status = await self._stub_for(address).GetReplicaStatus(
                paramserver.GetReplicaStatusRequest(), timeout=self.ack_timeout_s
            )
        except grpc.RpcError:
            return None
        return status.epoch

    @staticmethod
    def commit_event(
        address: str, err: RpcError | None
    ) -> commit.BackupAcked | commit.BackupFailed | commit.EpochRefused:
        """What a backup's answer to a forward or a commit means to the state machines."""
        if err is None:
            return commit.BackupAcked(address)
        if err.kind in (ErrorKind.STALE_EPOCH, ErrorKind.FENCED):
            return commit.EpochRefused(address, err.message)
        return commit.BackupFailed(address, err.message)

    @staticmethod
    def cancel_forwards(streams: Sequence[ForwardStream]) -> None:
        for s in streams:
            s.cancel()

    def commit_request(
        self, job_id: str, base_version: int, entries: Sequence[Entry]
    ) -> paramserver.ReplicateCommitRequest:
        return paramserver.ReplicateCommitRequest(
            epoch=self.replica.epoch,
            job_id=job_id,
            base_version=base_version,
            new_version=base_version + 1,
            entries=[e.to_proto() for e in entries],
        )

    async def commit_one(self, address: str, request) -> RpcError | None:
        """Send one commit to one backup (runtime.JobHost.commit runs the round), on
        the replication stream when it is open."""
        open_stream = self._stream_to(address)
        if open_stream is not None:
            link, call = open_stream
            return await link.commit(call, request)
        try:
            await self._stub_for(address).ReplicateCommit(request, timeout=self.ack_timeout_s)
            return None
        except grpc.RpcError as exc:
            return RpcError.from_grpc(exc)

    # --- state transfer ----------------------------------------------------------

    async def answers(self, address: str) -> bool:
        """Does the backup answer within the ack timeout? Asked before a state transfer,
        which holds the job's lock: a hung backup must not hold up every push."""
        try:
            await self._stub_for(address).GetReplicaStatus(
                paramserver.GetReplicaStatusRequest(), timeout=self.ack_timeout_s
            )
        except grpc.RpcError:
            return False
        return True

    async def install(self, address: str, header: paramserver.InstallStateHeader, tensors) -> None:
        """Send a job's whole state to one backup (caller holds the job's lock)."""
        first = paramserver.InstallStateRequest(header=header)
        chunks = codec.encode_chunk_messages(tensors, self.chunk_bytes)

        async def messages():
            yield first
            for message in chunks:
                yield message

        try:
            answer = await self._stub_for(address).InstallState(
                messages(), timeout=REPLICATION_TIMEOUT_S
            )
        except grpc.RpcError as exc:
            err = RpcError.from_grpc(exc)
            await self._check_fenced(address, err)
            self.drop(address, header.model.job_id, err.message)
            return
        link = self.replica.backups.get(address)
        if link is not None:
            self._answered_from(address, answer.instance)
            link.synced_jobs.add(header.model.job_id)
            link.last_error = ""
        self.acked[(address, header.model.job_id)] = header.version

    async def forward_evaluation(self, request: paramserver.RecordEvaluationRequest) -> None:
        """An evaluation to every backup holding the job, under this primary's epoch.
        Metrics, not state: a backup that misses one only lacks that row."""
        forward = paramserver.RecordEvaluationRequest()
        forward.CopyFrom(request)
        forward.epoch, forward.from_primary = self.replica.epoch, True
        for address in self.synced(request.job_id):
            try:
                await self._stub_for(address).RecordEvaluation(forward, timeout=self.ack_timeout_s)
            except grpc.RpcError as exc:
                await self._check_fenced(address, RpcError.from_grpc(exc))
                log.warning("evaluation not forwarded", backup=address, error=str(exc))

    async def delete(self, job_id: str) -> None:
        request = paramserver.DeleteModelRequest(job_id=job_id, epoch=self.replica.epoch)
        for address in list(self.replica.backups):
            try:
                await self._stub_for(address).DeleteModel(request, timeout=5)
            except grpc.RpcError:
                pass  # a backup that missed the delete is re-installed without the job
            link = self.replica.backups.get(address)
            if link is not None:
                link.synced_jobs.discard(job_id)
