"""The replication stream: one long-lived ``ReplicateStream`` call per (primary, backup)
that carries the forwarded pushes and the commits, and brings back their answers.

Before it, every step cost a ``ReplicatePush`` call per slot and a
``ReplicateCommit`` call per backup, each a new HTTP/2 stream with its own
headers, trailers and wake-ups on both ends. On the stream an operation is a
few messages tagged with its number (``op``): a push is its header, its chunks
and an end; a commit is one message; each is answered by one message.

Primary side (:class:`StreamLink`, one per backup, kept by the
:class:`~services.paramserver.replicator.Replicator`): opened the first time a
backup is replicated to (``open`` answered ``opened``), used once open, and
reopened after it broke, at most once per ``REOPEN_AFTER_S``. Until it is open
the unary calls carry the work, so a backup that does not know the RPC, or a
stream being reopened, costs nothing but the old per-call price. The same
bounds as the unary calls hold: each write and each answer is waited for at
most the ack timeout, after which the stream is torn down (every operation
still open on it fails, and the backup drops out of sync as a failed call
would make it).

Backup side (:class:`BackupSession`, one per incoming stream): every push
header and every commit carries the sender's epoch and is checked as the unary
calls check theirs; a push is staged at its end message, a commit runs in a
task of its own (it may wait for pushes still arriving on the stream), and a
failure is answered for that operation only, with the status the unary call
would have ended with.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import structlog

from stalwart import codec
from stalwart.api import paramserver
from stalwart.errors import ErrorKind, RpcError, StalwartError

log = structlog.get_logger(__name__)

# How long after a failed open or a broken stream the unary calls carry the work
# before the stream is tried again; a backup that does not know the RPC is asked
# again only this much later.
REOPEN_AFTER_S = 1.0
UNIMPLEMENTED_RETRY_S = 60.0
# Pushes a backup assembles at once on one stream (a sender over it is broken).
MAX_OPEN_PUSHES = 256

_CODES = {code.value[0]: code for code in grpc.StatusCode}


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _op_field(op: int) -> bytes:
    return b"\x08" + _varint(op)  # uint64 op = 1


@dataclass(frozen=True, slots=True)
class OpChunk:
    """A stream chunk message as the primary writes it (its op field, then the
    chunk: ``StreamForward.write``), read from the bytes received."""

    op: int
    chunk: codec.WireChunk


def request_reader(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """The backup's gRPC deserializer for the stream: chunk messages as
    :class:`OpChunk`, whose data is not copied (protobuf's message copies it each
    time it is read); anything else by ``parse``."""

    def deserializer(message: bytes) -> Any:
        if len(message) > 2 and message[0] == 0x08:  # uint64 op = 1 first
            op, pos = codec.read_varint(message, 1)
            chunk = codec.read_chunk_message(message, pos) if pos > 0 else None
            if chunk is not None:
                return OpChunk(op, chunk)
        return parse(message)

    return deserializer


class StreamLink:
    """The primary's replication stream to one backup."""

    def __init__(
        self,
        address: str,
        open_call: Callable[[], grpc.aio.StreamStreamCall],
        epoch: Callable[[], int],
        ack_timeout_s: float,
        opened: Callable[[str], None] = lambda instance: None,
    ):
        self.address = address
        self._open_call = open_call
        self._epoch = epoch
        self._opened = opened  # told the backup's process instance at each opening
        self.ack_timeout_s = ack_timeout_s
        self.call: grpc.aio.StreamStreamCall | None = None
        self.ready = False
        self._reader: asyncio.Task | None = None
        self._write_lock = asyncio.Lock()
        self._ops: dict[int, asyncio.Future] = {}
        self._next_op = 1
        self._retry_at = 0.0
        self.last_error = ""

    # --- opening and breaking ----------------------------------------------------

    def usable(self) -> grpc.aio.StreamStreamCall | None:
        """The open call to put an operation on, or None (use the unary calls);
        starts opening the stream when it is due."""
        if self.ready and self.call is not None:
            return self.call
        if self.call is None and time.monotonic() >= self._retry_at:
            self._start()
        return None

    def _start(self) -> None:
        try:
            call = self._open_call()
        except Exception as exc:  # noqa: BLE001 - a stub that cannot make the call: stay unary
            self._retry_at = time.monotonic() + UNIMPLEMENTED_RETRY_S
            self.last_error = str(exc) or type(exc).__name__
            return
        self.call = call
        self._reader = asyncio.ensure_future(self._read(call))

    async def _read(self, call: grpc.aio.StreamStreamCall) -> None:
        reason = "the backup ended the replication stream"
        retry_s = REOPEN_AFTER_S
        try:
            opening = paramserver.ReplicateStreamRequest(
                open=paramserver.ReplicateStreamOpen(epoch=self._epoch())
            )
            await asyncio.wait_for(call.write(opening), self.ack_timeout_s)
            first = await asyncio.wait_for(call.read(), self.ack_timeout_s)
            if first is grpc.aio.EOF or first.WhichOneof("result") != "opened":
                if first is not grpc.aio.EOF and first.WhichOneof("result") == "error":
                    reason = f"stream refused: {first.error.message}"
                raise _Ended
            if self.call is call:
                # before any operation can use the stream: a restarted backup's
                # jobs must be out of sync by then
                self._opened(first.opened.instance)
                self.ready = True
            while True:
                message = await call.read()
                if message is grpc.aio.EOF:
                    raise _Ended
                self._answer(message)
        except _Ended:
            pass
        except TimeoutError:
            reason = f"backup did not open the replication stream within {self.ack_timeout_s} s"
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            if code is grpc.StatusCode.UNIMPLEMENTED:
                retry_s = UNIMPLEMENTED_RETRY_S
            reason = (
                f"replication stream broke: {exc.details() if hasattr(exc, 'details') else exc}"
            )
        except asyncio.CancelledError:
            reason = "replication stream closed"
            raise
        except Exception as exc:  # noqa: BLE001 - whatever ended it, the link goes on unary
            reason = f"replication stream failed: {exc!r}"
        finally:
            self._broken(call, reason, retry_s)

    def _answer(self, message: paramserver.ReplicateStreamResponse) -> None:
        fut = self._ops.pop(message.op, None)
        if fut is None or fut.done():
            return  # an operation given up on (timed out, abandoned)
        kind = message.WhichOneof("result")
        if kind == "error":
            e = message.error
            code = _CODES.get(e.code, grpc.StatusCode.UNKNOWN)
            fut.set_result(RpcError(code, e.message, e.reason))
        else:
            fut.set_result(message)

    def _broken(self, call: grpc.aio.StreamStreamCall, reason: str, retry_s: float) -> None:
        if self.call is not call:
            return
        self.call, self.ready, self._reader = None, False, None
        self.last_error = reason
        self._retry_at = time.monotonic() + retry_s
        call.cancel()
        failed = RpcError(grpc.StatusCode.UNAVAILABLE, reason)
        for fut in self._ops.values():
            if not fut.done():
                fut.set_result(failed)
        self._ops.clear()
        log.info("replication stream down", backup=self.address, reason=reason)

    def break_(self, call: grpc.aio.StreamStreamCall, reason: str) -> None:
        """Tear the stream down (the backup stopped answering): every open operation fails."""
        reader = self._reader if self.call is call else None
        self._broken(call, reason, REOPEN_AFTER_S)
        if reader is not None:
            reader.cancel()

    def close(self) -> None:
        if self.call is not None:
            self.break_(self.call, "replication stream closed")

    # --- operations --------------------------------------------------------------

    def start_op(self) -> tuple[int, asyncio.Future]:
        op = self._next_op
        self._next_op += 1
        fut = self._ops[op] = asyncio.get_running_loop().create_future()
        return op, fut

    def forget(self, op: int) -> None:
        self._ops.pop(op, None)

    async def send(self, call: grpc.aio.StreamStreamCall, data: bytes, timeout_s: float) -> str:
        """Write one serialized message on ``call``; "" or why it could not be written
        (after which the stream is down)."""
        if self.call is not call:
            return self.last_error or "replication stream reopened"

        async def write() -> None:
            async with self._write_lock:
                if self.call is not call:
                    raise _Ended
                await call.write(data)

        try:
            await asyncio.wait_for(write(), max(timeout_s, 0))
            return ""
        except _Ended:
            return self.last_error or "replication stream reopened"
        except TimeoutError:
            reason = f"backup took no data for {self.ack_timeout_s} s"
        except (grpc.RpcError, grpc.aio.UsageError, asyncio.InvalidStateError) as exc:
            reason = str(exc) or "write failed"
        self.break_(call, reason)
        return reason

    async def answer(
        self, call: grpc.aio.StreamStreamCall, fut: asyncio.Future, timeout_s: float
    ) -> paramserver.ReplicateStreamResponse | RpcError:
        try:
            return await asyncio.wait_for(asyncio.shield(fut), max(timeout_s, 0))
        except TimeoutError:
            reason = f"backup did not acknowledge within {self.ack_timeout_s} s"
            self.break_(call, reason)
            return RpcError(grpc.StatusCode.DEADLINE_EXCEEDED, reason)

    async def commit(self, call, request: paramserver.ReplicateCommitRequest) -> RpcError | None:
        """One commit on the stream, within one ack timeout (as the unary call)."""
        deadline = time.monotonic() + self.ack_timeout_s
        op, fut = self.start_op()
        data = paramserver.ReplicateStreamRequest(op=op, commit=request).SerializeToString()
        error = await self.send(call, data, self.ack_timeout_s)
        if error:
            self.forget(op)
            return RpcError(grpc.StatusCode.UNAVAILABLE, error)
        result = await self.answer(call, fut, deadline - time.monotonic())
        return result if isinstance(result, RpcError) else None


class StreamForward:
    """One push forwarded on a :class:`StreamLink`; the interface of
    :class:`~services.paramserver.replicator.ForwardStream`."""

    def __init__(self, link: StreamLink, call: grpc.aio.StreamStreamCall):
        self.address = link.address
        self.link = link
        self.call = call
        self.op, self.fut = link.start_op()
        self.ack_timeout_s = link.ack_timeout_s
        self.error = ""
        self._prefix = _op_field(self.op)

    async def write(self, message: paramserver.ReplicatePushRequest | bytes) -> None:
        if self.error:
            return
        if isinstance(message, bytes):  # a serialized {chunk = 2}: add {op = 1}
            data = self._prefix + message
        else:
            data = paramserver.ReplicateStreamRequest(
                op=self.op, push=message.header
            ).SerializeToString()
        self.error = await self.link.send(self.call, data, self.ack_timeout_s)

    async def finish(self) -> RpcError | None:
        if self.error:
            self.link.forget(self.op)
            return RpcError(grpc.StatusCode.UNAVAILABLE, self.error)
        deadline = time.monotonic() + self.ack_timeout_s
        end = paramserver.ReplicateStreamRequest(op=self.op, end=paramserver.ReplicateStreamEnd())
        error = await self.link.send(self.call, end.SerializeToString(), self.ack_timeout_s)
        if error:
            self.link.forget(self.op)
            return RpcError(grpc.StatusCode.UNAVAILABLE, error)
        result = await self.link.answer(self.call, self.fut, deadline - time.monotonic())
        return result if isinstance(result, RpcError) else None

    def cancel(self) -> None:
        """The push failed here: the backup drops what it got of it (best effort)."""
        self.link.forget(self.op)
        if not self.error and self.link.call is self.call:
            abandon = paramserver.ReplicateStreamRequest(
                op=self.op, abandon=paramserver.ReplicateStreamAbandon()
            )
            task = asyncio.ensure_future(
                self.link.send(self.call, abandon.SerializeToString(), self.ack_timeout_s)
            )
            task.add_done_callback(lambda t: t.cancelled() or t.exception())


class _Ended(Exception):
    """The stream ended or was replaced."""


# --- backup side -------------------------------------------------------------------


class BackupSession:
    """One incoming replication stream on a backup.

    ``check(epoch)`` raises the unary calls' epoch error; ``stage(header, assembler)``
    and ``commit(request, wait_s)`` do what ReplicatePush and ReplicateCommit do;
    ``instance`` (this process) is told to the primary when the stream opens.
    """

    def __init__(
        self,
        context: grpc.aio.ServicerContext,
        check: Callable[[int], None],
        limits: codec.Limits,
        stage: Callable[[paramserver.ReplicatePushHeader, codec.ChunkAssembler], Awaitable[None]],
        commit: Callable[[paramserver.ReplicateCommitRequest], Awaitable[int]],
        instance: str = "",
    ):
        self.context = context
        self.instance = instance
        self.check = check
        self.limits = limits
        self.stage = stage
        self.commit = commit
        self.pushes: dict[int, tuple[paramserver.ReplicatePushHeader, codec.ChunkAssembler]] = {}
        self.tasks: set[asyncio.Task] = set()
        self._write_lock = asyncio.Lock()

    async def run(self, request_iterator) -> None:
        try:
            first = await anext(aiter(request_iterator))
        except StopAsyncIteration:
            return
        if isinstance(first, OpChunk) or first.WhichOneof("part") != "open":
            raise StalwartError(ErrorKind.BAD_STREAM, "the first message must be open")
        try:
            self.check(first.open.epoch)
        except StalwartError as err:
            await self._error(0, err)
            return
        await self._write(
            paramserver.ReplicateStreamResponse(
                opened=paramserver.ReplicateStreamOpened(instance=self.instance)
            )
        )
        try:
            async for message in request_iterator:
                await self._handle(message)
        finally:
            for task in self.tasks:
                task.cancel()

    async def drain(self) -> None:
        """Let the commits still running finish (shutdown)."""
        if self.tasks:
            await asyncio.wait(set(self.tasks))

    async def _handle(self, message: paramserver.ReplicateStreamRequest | OpChunk) -> None:
        if isinstance(message, OpChunk):
            op, part, chunk = message.op, "chunk", message.chunk
        else:
            op, part = message.op, message.WhichOneof("part")
            chunk = message.chunk if part == "chunk" else None
        try:
            if part == "chunk":
                push = self.pushes.get(op)
                if push is None:
                    return  # of a push already refused (its error was answered)
                push[1].add(chunk)
            elif part == "push":
                header = message.push
                self.check(header.epoch)
                if len(self.pushes) >= MAX_OPEN_PUSHES:
                    raise StalwartError(
                        ErrorKind.LIMIT_EXCEEDED, f"{MAX_OPEN_PUSHES} pushes open on one stream"
                    )
                push = header.push
                assembler = codec.ChunkAssembler(push.tensors, self.limits, push.packed)
                self.pushes[op] = (header, assembler)
            elif part == "end":
                push = self.pushes.pop(op, None)
                if push is None:
                    return
                if not push[1].complete:
                    raise StalwartError(
                        ErrorKind.TRUNCATED_STREAM, "push ended before its last chunk"
                    )
                await self.stage(push[0], push[1])
                await self._write(
                    paramserver.ReplicateStreamResponse(
                        op=op, push=paramserver.ReplicatePushResponse()
                    )
                )
            elif part == "abandon":
                self.pushes.pop(op, None)
            elif part == "commit":
                self.check(message.commit.epoch)
                task = asyncio.ensure_future(self._commit(op, message.commit))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
            else:
                raise StalwartError(ErrorKind.BAD_STREAM, f"unexpected {part or 'empty'} message")
        except StalwartError as err:
            self.pushes.pop(op, None)
            await self._error(op, err)

    async def _commit(self, op: int, request: paramserver.ReplicateCommitRequest) -> None:
        try:
            version = await self.commit(request)
        except StalwartError as err:
            await self._error(op, err)
            return
        except Exception as exc:  # noqa: BLE001 - answered as the unary call would be
            log.exception("commit on the replication stream failed")
            await self._error(
                op, StalwartError(ErrorKind.INTERNAL, f"internal error ({type(exc).__name__})")
            )
            return
        await self._write(
            paramserver.ReplicateStreamResponse(
                op=op, commit=paramserver.ReplicateCommitResponse(version=version)
            )
        )

    async def _error(self, op: int, err: StalwartError) -> None:
        error = paramserver.ReplicateStreamError(
            code=err.kind.code.value[0], message=err.message, reason=err.kind.reason
        )
        await self._write(paramserver.ReplicateStreamResponse(op=op, error=error))

    async def _write(self, message: paramserver.ReplicateStreamResponse) -> None:
        async with self._write_lock:
            with contextlib.suppress(grpc.aio.UsageError, asyncio.InvalidStateError):
                await self.context.write(message)  # the stream ended: nobody waits for it
