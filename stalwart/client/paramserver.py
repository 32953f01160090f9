"""Parameter-server client: finds each shard group's primary, routes tensor
pieces by the shard map, and retries through failover with the same
(job, step, slot) key so that every push is applied exactly once.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import grpc
import structlog
import torch
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_exponential

from stalwart import codec, shardmap
from stalwart.api import common, coordinator, paramserver, paramserver_grpc
from stalwart.channel import ChannelConfig, cancelled_by_caller, open_channel
from stalwart.checkpoint import check_chunk_bytes
from stalwart.errors import ErrorKind, RpcError
from stalwart.offload import tensor_bytes

log = structlog.get_logger(__name__)

# Failures after which the same call, sent to the (possibly new) primary, is safe.
_RETRY_KINDS = {
    ErrorKind.UNAVAILABLE,
    ErrorKind.NO_INSYNC_BACKUP,
    ErrorKind.NOT_PRIMARY,
    ErrorKind.FENCED,
    ErrorKind.STALE_EPOCH,
    ErrorKind.UNKNOWN_EPOCH,  # a replica not (yet) configured at our epoch: find the primary
    ErrorKind.DEADLINE_EXCEEDED,
}


# How long a search for the primary waits for the other replicas once one primary
# has answered: a healthy replica answers GetReplicaStatus in a millisecond or two.
DISCOVER_GRACE_S = 0.25


def _answered(question: asyncio.Future) -> bool:
    return not question.cancelled() and question.exception() is None


def _is_primary(status: paramserver.GetReplicaStatusResponse) -> bool:
    return status.role == common.REPLICA_ROLE_PRIMARY


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, RpcError) and exc.kind in _RETRY_KINDS


class ParamServerStub(paramserver_grpc.ParamServerServiceStub):
    """The generated stub, but its client-streaming calls also take messages
    already serialized (bytes from :func:`codec.encode_chunk_messages`), so
    tensor chunks go out with one copy from the tensor instead of three, and its
    Pull yields each message as the bytes received, for :class:`_PullAssembly` to
    read a chunk's data where it lies (one copy into the tensor instead of three)."""

    def __init__(self, channel: grpc.aio.Channel):
        super().__init__(channel)
        service = paramserver.DESCRIPTOR.services_by_name["ParamServerService"].full_name
        for method, request, response in (
            ("RegisterModel", paramserver.RegisterModelRequest, paramserver.RegisterModelResponse),
            ("Push", paramserver.PushRequest, paramserver.PushResponse),
            ("ReplicatePush", paramserver.ReplicatePushRequest, paramserver.ReplicatePushResponse),
            ("InstallState", paramserver.InstallStateRequest, paramserver.InstallStateResponse),
        ):
            setattr(
                self,
                method,
                channel.stream_unary(
                    f"/{service}/{method}",
                    request_serializer=codec.passthrough(request.SerializeToString),
                    response_deserializer=response.FromString,
                ),
            )
        self.Pull = channel.unary_stream(
            f"/{service}/Pull",
            request_serializer=paramserver.PullRequest.SerializeToString,
            response_deserializer=None,  # the bytes as received
        )
        # pushes on one open call, as serialized bytes (the same as Push's)
        self.PushStream = channel.stream_stream(
            f"/{service}/PushStream",
            request_serializer=codec.passthrough(paramserver.PushStreamRequest.SerializeToString),
            response_deserializer=paramserver.PushStreamResponse.FromString,
        )
        # the replication stream: chunks go out as serialized bytes too
        self.ReplicateStream = channel.stream_stream(
            f"/{service}/ReplicateStream",
            request_serializer=codec.passthrough(
                paramserver.ReplicateStreamRequest.SerializeToString
            ),
            response_deserializer=paramserver.ReplicateStreamResponse.FromString,
        )


@dataclass(frozen=True)
class PushResult:
    version: int
    duplicate: bool
    # asked for with ``answer_parameters``: (version, tensors changed since the
    # push's base version) when the answer carried them, else None
    parameters: tuple[int, dict[str, torch.Tensor]] | None = None


class _PullAssembly:
    """A pull's messages, a header and then its chunks, added one by one (a large
    pull is never held as messages and tensors at once); ``result`` is
    (version, tensors)."""

    def __init__(self):
        self.header = None
        self.assembler: codec.ChunkAssembler | None = None

    def add(self, message: paramserver.PullResponse | bytes) -> None:
        """One message: parsed, or as received (ParamServerStub.Pull), whose chunk is
        read without protobuf (:func:`codec.read_chunk_message`)."""
        if isinstance(message, bytes):
            chunk = codec.read_chunk_message(message)
            if chunk is not None:
                self._place(chunk)
                return
            message = paramserver.PullResponse.FromString(message)
        if message.WhichOneof("part") == "header":
            self.header = message.header
            self.assembler = codec.ChunkAssembler(self.header.tensors, packed=self.header.packed)
        else:
            self._place(message.chunk)

    def _place(self, chunk: common.TensorChunk | codec.WireChunk) -> None:
        if self.assembler is None:
            raise RpcError(grpc.StatusCode.INTERNAL, "pull stream began without a header")
        self.assembler.add(chunk)

    def result(self) -> tuple[int, dict[str, torch.Tensor]]:
        if self.header is None:
            raise RpcError(grpc.StatusCode.INTERNAL, "pull stream was empty")
        return self.header.version, self.assembler.finish()


class _PushStreams:
    """Open PushStream calls, one per replica, each carrying one push at a time.

    A push goes over the replica's open call when it is idle, saving the cost of a
    call per step at both ends (docs/performance.md, lever 19). Anything but the
    answer (the call refused, broken, cut or never opened) closes that call and
    returns None: the caller sends the same push as a Push call, whose answer or
    status is the one to act on (the same key: applied once either way). Only the
    caller's deadline is raised here, as the Push call would raise it."""

    def __init__(self) -> None:
        self._calls: dict[str, grpc.aio.StreamStreamCall] = {}
        self._busy: set[str] = set()
        self._unsupported: set[str] = set()  # replicas that predate the call

    async def push(
        self, stub: ParamServerStub, address: str, messages, timeout_s: float
    ) -> paramserver.PushStreamResponse | None:
        if address in self._busy or address in self._unsupported:
            return None  # busy with another push of this client, or not served there
        self._busy.add(address)
        try:
            call = self._calls.get(address)
            if call is None:
                call = self._calls[address] = stub.PushStream()
            answer = None
            try:
                async with asyncio.timeout(timeout_s):
                    for message in messages:
                        await call.write(message)
                    answer = await call.read()
            except TimeoutError:
                self.drop(address)
                raise RpcError(
                    grpc.StatusCode.DEADLINE_EXCEEDED, f"push not answered in {timeout_s:.0f}s"
                ) from None
            except asyncio.CancelledError:
                self.drop(address)  # a push cut half-way: the call cannot carry another
                if cancelled_by_caller():
                    raise
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    self._unsupported.add(address)
            except (asyncio.InvalidStateError, grpc.aio.UsageError):
                pass
            if not isinstance(answer, paramserver.PushStreamResponse):
                self.drop(address)  # refused (its status ended the call), broken or ended
                return None
            return answer
        finally:
            self._busy.discard(address)

    def drop(self, address: str) -> None:
        call = self._calls.pop(address, None)
        if call is not None:
            call.cancel()

    def close(self) -> None:
        for address in list(self._calls):
            self.drop(address)


class _Redirected(RpcError):
    """A call cut by :meth:`ShardGroupClient.follow`: retried at the named primary."""


def replica_channels(
    config: ChannelConfig | None = None, token: str | None = None
) -> Callable[[str], grpc.aio.Channel]:
    """How a shard group client opens its channels: as ``config`` says, with the role
    ``token``, and without gRPC's transparent retries. The client finds the next
    primary itself on UNAVAILABLE; with them every call to a killed primary, and
    every search for the next one that asked it too, took 0.7 s (0.1 + 0.2 + 0.4 s
    of retries) before the failover could begin."""
    config = dataclasses.replace(config or ChannelConfig(), retry_unavailable=False)
    return lambda address: open_channel(address, config, token)


class ShardGroupClient:
    """One shard group: its replica addresses, the primary found among them, its epoch."""

    def __init__(
        self,
        addresses: Sequence[str],
        open_channel: Callable[[str], grpc.aio.Channel] | None = None,
        call_timeout_s: float = 30.0,
        retry_for_s: float = 60.0,
        chunk_bytes: int = codec.DEFAULT_CHUNK_BYTES,
    ):
        self.addresses = list(addresses)
        self._open_channel = open_channel or replica_channels()  # a test passes its own
        self._channels: dict[str, grpc.aio.Channel] = {}
        # A stub builds one callable per method (~0.1 ms): one per address, not per call.
        self._stubs: dict[str, ParamServerStub] = {}
        self.call_timeout_s = call_timeout_s
        self.retry_for_s = retry_for_s
        self.chunk_bytes = check_chunk_bytes(chunk_bytes)  # INVALID_ARGUMENT out of range
        self.primary: str | None = None
        self.epoch = 0
        self.push_streams = _PushStreams()
        self._attempts: dict[asyncio.Task, str] = {}  # calls under way -> the replica asked

    def stub(self, address: str) -> ParamServerStub:
        if address not in self._stubs:
            channel = self._open_channel(address)
            self._channels[address] = channel
            self._stubs[address] = ParamServerStub(channel)
        return self._stubs[address]

    async def close(self) -> None:
        self.push_streams.close()
        await asyncio.gather(*(c.close() for c in self._channels.values()))
        self._channels.clear()
        self._stubs.clear()

    async def status(self, address: str) -> paramserver.GetReplicaStatusResponse:
        try:
            return await self.stub(address).GetReplicaStatus(
                paramserver.GetReplicaStatusRequest(), timeout=min(self.call_timeout_s, 5.0)
            )
        except grpc.RpcError as exc:
            raise RpcError.from_grpc(exc) from None

    async def discover(self) -> str:
        """Ask every replica; the primary with the highest epoch wins. One below the epoch
        this client knows (from a search before, or the shard map) is a deposed primary
        that does not know it yet: taken, it served its old state, and this client's
        epoch went back to its, so its own refusal of an older epoch was lost too."""
        primaries = [
            (a, st.epoch)
            for a, st in await self._answers()
            if _is_primary(st) and st.epoch >= self.epoch
        ]
        if not primaries:
            raise RpcError(grpc.StatusCode.UNAVAILABLE,
                           f"no primary at epoch {self.epoch} or later among {self.addresses}")  # fmt: skip
        self.primary, self.epoch = max(primaries, key=lambda answer: answer[1])
        return self.primary

    async def _answers(self) -> list[tuple[str, paramserver.GetReplicaStatusResponse]]:
        """Every replica's status, except that once a primary has answered the others
        have DISCOVER_GRACE_S more: one that hangs (stopped, not dead) would otherwise
        hold each search for the whole timeout. Should a stale primary be the one found,
        its backups fence it, and the next search goes past it."""
        asked = {asyncio.ensure_future(self.status(a)): a for a in self.addresses}
        pending, answers, grace_ends = set(asked), [], None
        loop = asyncio.get_running_loop()
        try:
            while pending:
                wait_s = None if grace_ends is None else max(0.0, grace_ends - loop.time())
                done, pending = await asyncio.wait(
                    pending, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED
                )
                if not done:
                    break  # the grace is over
                answers += [(asked[q], q.result()) for q in done if _answered(q)]
                if grace_ends is None and any(_is_primary(st) for _, st in answers):
                    grace_ends = loop.time() + DISCOVER_GRACE_S
        finally:
            for question in pending:
                question.cancel()
        return answers

    def follow(self, primary: str, epoch: int) -> None:
        """The coordinator names ``primary`` (one of this group's replicas) at ``epoch``:
        calls under way to any other replica are cut and sent there at once, under the
        same key. A primary that hangs (stopped, not dead) never refuses them, so
        otherwise they waited out their deadline though a backup had taken over."""
        if primary not in self.addresses or epoch < self.epoch:
            return
        self.primary, self.epoch = primary, epoch
        for task, asked in self._attempts.items():
            if asked != primary:
                task.cancel()

    async def _attempt_at(self, address: str, attempt: Callable[[str], object]):
        """``attempt(address)`` as a task of its own, which :meth:`follow` can cut."""
        task = asyncio.ensure_future(attempt(address))
        self._attempts[task] = address
        try:
            return await task
        except asyncio.CancelledError:
            if cancelled_by_caller() or self.primary in (None, address):
                raise
            raise _Redirected(
                grpc.StatusCode.UNAVAILABLE, f"{address} no longer leads; {self.primary} does"
            ) from None
        finally:
            del self._attempts[task]

    async def _with_failover(self, attempt: Callable[[str], object]):
        retrying = AsyncRetrying(
            retry=retry_if_exception(_retryable),
            stop=stop_after_delay(self.retry_for_s),
            wait=wait_exponential(multiplier=0.02, max=0.5),
            reraise=True,
        )
        async for try_ in retrying:
            with try_:
                try:
                    primary = self.primary or await self.discover()
                    return await self._attempt_at(primary, attempt)
                except _Redirected:
                    raise  # sent again to the primary follow() set, without a search
                except grpc.RpcError as exc:
                    err = RpcError.from_grpc(exc)
                    if err.kind in _RETRY_KINDS:
                        self.primary = None  # find the primary again before the retry
                    raise err from None
                except RpcError:
                    self.primary = None
                    raise
                except asyncio.CancelledError:
                    if cancelled_by_caller():
                        raise
                    # grpc.aio cancels a client-streaming call by itself when writing
                    # the next message fails because the server already ended the
                    # stream (a replica killed mid-push): the call died, not our task.
                    self.primary = None
                    raise RpcError(
                        grpc.StatusCode.UNAVAILABLE,
                        "the call was cancelled by grpc after its stream broke",
                    ) from None

    # --- calls ---------------------------------------------------------------

    async def register_model(
        self, header: paramserver.ModelHeader, tensors: Sequence[torch.Tensor]
    ) -> paramserver.RegisterModelResponse:
        async def attempt(address):
            header.epoch = self.epoch
            messages = [paramserver.RegisterModelRequest(header=header)]
            messages += codec.encode_chunk_messages(tensors, self.chunk_bytes)
            return await self.stub(address).RegisterModel(
                iter(messages), timeout=self.call_timeout_s
            )

        return await self._with_failover(attempt)

    async def push(
        self,
        job_id: str,
        step: int,
        slot: int,
        base_version: int,
        grads: Mapping[str, torch.Tensor],
        loss: float | None = None,
        answer_parameters: bool = False,
    ) -> PushResult:
        """``answer_parameters``: ask for the parameters changed since ``base_version``
        in the answer (up to a chunk's worth), which saves the pull after it."""
        names = list(grads)
        answer_bytes = self.chunk_bytes + codec.PUSH_ANSWER_SLACK_BYTES if answer_parameters else 0
        tensors = [grads[n] for n in names]
        specs = [codec.spec_of(n, grads[n]) for n in names]

        async def attempt(address):
            head = paramserver.PushHeader(
                job_id=job_id,
                step=step,
                slot=slot,
                base_version=base_version,
                epoch=self.epoch,
                tensors=specs,
                loss=loss,
                packed=True,
                answer_parameters_bytes=answer_bytes,
            )

            def messages():
                # Encoded lazily so encoding overlaps sending; a retry encodes
                # again and yields the very same bytes and CRCs. Bytes, as both
                # Push and PushStream take them.
                yield paramserver.PushRequest(header=head).SerializeToString()
                yield from codec.encode_chunk_messages(tensors, self.chunk_bytes, packed=True)

            stub = self.stub(address)
            resp = await self.push_streams.push(stub, address, messages(), self.call_timeout_s)
            if resp is None:
                resp = await stub.Push(messages(), timeout=self.call_timeout_s)
            parameters = None
            if resp.parameters:
                assembly = _PullAssembly()
                for message in resp.parameters:
                    assembly.add(message)
                parameters = assembly.result()
            return PushResult(resp.version, resp.duplicate, parameters)

        return await self._with_failover(attempt)

    async def pull(
        self,
        job_id: str,
        since_version: int = -1,
        min_version: int = 0,
        optimizer_state: bool = False,
    ) -> tuple[int, dict[str, torch.Tensor]]:
        """``optimizer_state``: the optimizer's ``<piece>/<key>`` tensors come too."""

        async def attempt(address):
            request = paramserver.PullRequest(
                job_id=job_id,
                since_version=since_version,
                min_version=min_version,
                epoch=self.epoch,
                chunk_size=self.chunk_bytes,
                optimizer_state=optimizer_state,
                packed=True,
            )
            stream = self.stub(address).Pull(request, timeout=self.call_timeout_s)
            assembly = _PullAssembly()
            async for message in stream:
                assembly.add(message)
            return assembly.result()

        return await self._with_failover(attempt)

    async def record_evaluation(
        self, job_id: str, version: int, metrics: Mapping[str, float]
    ) -> bool:
        """Report an evaluation of ``version``; True when it was recorded before."""

        async def attempt(address):
            request = paramserver.RecordEvaluationRequest(
                job_id=job_id, epoch=self.epoch,
                evaluation=paramserver.Evaluation(version=version, metrics=dict(metrics)),
            )  # fmt: skip
            resp = await self.stub(address).RecordEvaluation(request, timeout=self.call_timeout_s)
            return resp.duplicate

        return await self._with_failover(attempt)

    async def fingerprint(self, job_id: str, address: str | None = None):
        target = address or self.primary or await self.discover()
        try:
            return await self.stub(target).GetFingerprint(
                paramserver.GetFingerprintRequest(job_id=job_id), timeout=self.call_timeout_s
            )
        except grpc.RpcError as exc:
            raise RpcError.from_grpc(exc) from None


T = TypeVar("T")


async def _each_group(calls: Iterable[Awaitable[T]]) -> list[T]:
    """Every group's answer, in order. The first call to fail cancels the others, and
    they are waited for, before its error is raised: left running, a group's push
    went on retrying through failover for a minute after the caller had given up
    on the step, holding that replica's push stream."""
    tasks = [asyncio.ensure_future(c) for c in calls]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


class ParamServerClient:
    """All shard groups of a job's parameters, routed by the deterministic shard map."""

    def __init__(self, groups: Sequence[ShardGroupClient]):
        self.groups = list(groups)
        self.pieces: list[shardmap.Piece] = []
        # every group's part of the model fits in one chunk, so that a push's answer
        # can carry it (decided by register_model, from the registered parameters)
        self.answers_carry_parameters = False

    @property
    def num_shards(self) -> int:
        return len(self.groups)

    def plan(self, params: Mapping[str, torch.Tensor]) -> list[shardmap.Piece]:
        self.pieces = shardmap.build_shard_map(shardmap.shapes_of(params), self.num_shards)
        return self.pieces

    async def register_model(
        self,
        job_id: str,
        params: Mapping[str, torch.Tensor],
        optimizer: common.OptimizerSpec,
        consistency: common.ConsistencySpec,
        num_slots: int,
        buffers: Collection[str] = (),
        gradient_dtype: int = common.DTYPE_UNSPECIFIED,
    ) -> None:
        """``buffers``: names among ``params`` that are module buffers (not stepped);
        ``gradient_dtype``: the job's JobSpec.gradient_dtype (what its pushes carry)."""
        per_shard = shardmap.split(params, self.plan(params), self.num_shards)
        self.answers_carry_parameters = all(
            tensor_bytes(p.values()) <= g.chunk_bytes
            for g, p in zip(self.groups, per_shard, strict=True)
        )
        buffers = set(buffers)
        buffer_of = {p.piece_name for p in self.pieces if p.tensor_name in buffers}

        async def one(group: ShardGroupClient, pieces: dict[str, torch.Tensor]):
            header = paramserver.ModelHeader(
                job_id=job_id,
                optimizer=optimizer,
                consistency=consistency,
                num_slots=num_slots,
                tensors=[codec.spec_of(n, t) for n, t in pieces.items()],
                chunk_size=group.chunk_bytes,
                buffer_names=[n for n in pieces if n in buffer_of],
                gradient_dtype=gradient_dtype,
            )
            await group.register_model(header, list(pieces.values()))

        await _each_group(one(g, p) for g, p in zip(self.groups, per_shard, strict=True))

    async def push(
        self,
        job_id: str,
        step: int,
        slot: int,
        base_version: int,
        grads: Mapping[str, torch.Tensor],
        loss: float | None = None,
        answer_parameters: bool = False,
    ) -> list[PushResult]:
        """``loss``: the slot's training loss, kept in the job's metric history;
        ``answer_parameters``: see :meth:`ShardGroupClient.push` and :meth:`carried`."""
        per_shard = shardmap.split(grads, self.pieces, self.num_shards)
        return await _each_group(
            g.push(job_id, step, slot, base_version, p, loss, answer_parameters)
            for g, p in zip(self.groups, per_shard, strict=True)
        )

    def carried(self, results: Sequence[PushResult]):
        """What :meth:`pull` would return (version per shard, full tensors that changed),
        from the answers to one push made with ``answer_parameters``; None unless
        every group's answer carried its part."""
        if any(r.parameters is None for r in results):
            return None
        return self._joined([r.parameters for r in results])

    def _joined(self, per_group: Sequence[tuple[int, dict]], optimizer_state: bool = False):
        """(version per shard, full tensors) from each group's (version, pieces)."""
        per_shard = [t for _, t in per_group]
        tensors = shardmap.join(per_shard, self.pieces)
        if optimizer_state:
            tensors.update(shardmap.join_state(per_shard, self.pieces))
        return [v for v, _ in per_group], tensors

    async def pull(
        self,
        job_id: str,
        since_version: int = -1,
        min_version: int = 0,
        optimizer_state: bool = False,
    ):
        """Returns (version per shard, full tensors that changed); with ``optimizer_state``
        the optimizer's tensors too, as ``<param>/<key>`` (shardmap.join_state)."""
        results = await _each_group(
            g.pull(job_id, since_version, min_version, optimizer_state) for g in self.groups
        )
        return self._joined(results, optimizer_state)

    def primaries(self) -> list[str | None]:
        """Each group's primary as this client knows it (None: being searched for)."""
        return [g.primary for g in self.groups]

    def follow(self, groups: Sequence[coordinator.ShardGroup]) -> None:
        """Each group's primary as a shard map names it (:meth:`ShardGroupClient.follow`).
        ``groups``: the map's, which this client was built from in shard order."""
        if len(groups) != len(self.groups):
            return
        for client, group in zip(self.groups, sorted(groups, key=lambda g: g.shard), strict=True):
            client.follow(group.primary_address, group.epoch)

    async def record_evaluation(
        self, job_id: str, version: int, metrics: Mapping[str, float]
    ) -> bool:
        """To the first shard group, which keeps the job's metric history."""
        return await self.groups[0].record_evaluation(job_id, version, metrics)

    async def close(self) -> None:
        await asyncio.gather(*(g.close() for g in self.groups))
