"""The primary's end of the replication stream (services/paramserver/replstream.py)
against a scripted call: opening, answers, errors, a backup that stops answering,
and one that does not know the call."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from services.paramserver import replstream
from stalwart import codec
from stalwart.api import common, paramserver
from stalwart.errors import ErrorKind, RpcError

pytestmark = pytest.mark.timeout(30)


class ScriptedCall:
    """Writes are recorded; reads come from ``answers`` (an exception is raised)."""

    def __init__(self) -> None:
        self.written: list = []
        self.answers: asyncio.Queue = asyncio.Queue()
        self.cancelled = False

    async def write(self, data) -> None:
        if self.cancelled:
            raise grpc.aio.UsageError("call cancelled")
        self.written.append(data)

    async def read(self):
        item = await self.answers.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def cancel(self) -> None:
        self.cancelled = True
        self.answers.put_nowait(grpc.aio.EOF)

    def answer(self, **kw) -> None:
        self.answers.put_nowait(paramserver.ReplicateStreamResponse(**kw))

    def sent(self, index: int) -> paramserver.ReplicateStreamRequest:
        data = self.written[index]
        if isinstance(data, bytes):
            return paramserver.ReplicateStreamRequest.FromString(data)
        return data


def _link(calls: list[ScriptedCall], ack_timeout_s: float = 5.0) -> replstream.StreamLink:
    def open_call() -> ScriptedCall:
        calls.append(ScriptedCall())
        return calls[-1]

    return replstream.StreamLink("backup:1", open_call, lambda: 7, ack_timeout_s)


async def _open(link: replstream.StreamLink, calls: list[ScriptedCall]):
    assert link.usable() is None  # opening: the unary calls carry the work meanwhile
    call = calls[-1]
    call.answer(opened=paramserver.ReplicateStreamOpened())
    while not link.ready:
        await asyncio.sleep(0)
    assert call.sent(0).open.epoch == 7
    assert link.usable() is call
    return call


def _commit(base: int = 0) -> paramserver.ReplicateCommitRequest:
    return paramserver.ReplicateCommitRequest(epoch=7, job_id="j", base_version=base)


async def test_commits_are_answered_on_the_stream_with_their_errors() -> None:
    calls: list[ScriptedCall] = []
    link = _link(calls)
    call = await _open(link, calls)

    ok = asyncio.ensure_future(link.commit(call, _commit(0)))
    refused = asyncio.ensure_future(link.commit(call, _commit(1)))
    while len(call.written) < 3:
        await asyncio.sleep(0)
    first, second = call.sent(1), call.sent(2)
    assert first.commit.base_version == 0 and second.commit.base_version == 1
    assert first.op != second.op
    # answered out of order; each answer goes to its own operation
    stale = paramserver.ReplicateStreamError(
        code=grpc.StatusCode.FAILED_PRECONDITION.value[0], message="old", reason="STALE_EPOCH"
    )
    call.answer(op=second.op, error=stale)
    call.answer(op=first.op, commit=paramserver.ReplicateCommitResponse(version=1))
    assert await ok is None
    err = await refused
    assert isinstance(err, RpcError) and err.kind is ErrorKind.STALE_EPOCH
    assert link.ready  # an operation's error leaves the stream open


async def test_a_backup_that_stops_answering_fails_every_open_operation() -> None:
    calls: list[ScriptedCall] = []
    link = _link(calls, ack_timeout_s=0.2)
    call = await _open(link, calls)
    forward = replstream.StreamForward(link, call)
    await forward.write(codec_chunk())
    commit = await link.commit(call, _commit())  # never answered
    assert commit.code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert not link.ready and call.cancelled
    failed = await forward.finish()  # open on the torn-down stream: failed too
    assert failed.code is grpc.StatusCode.UNAVAILABLE
    assert link.usable() is None and len(calls) == 1  # reopened only a second later


async def test_a_backup_without_the_call_stays_on_unary_calls() -> None:
    calls: list[ScriptedCall] = []
    link = _link(calls)
    assert link.usable() is None
    calls[-1].answers.put_nowait(
        grpc.aio.AioRpcError(
            grpc.StatusCode.UNIMPLEMENTED, grpc.aio.Metadata(), grpc.aio.Metadata(), "no method"
        )
    )
    while link.call is not None:
        await asyncio.sleep(0)
    assert not link.ready and "no method" in link.last_error
    for _ in range(3):
        assert link.usable() is None
    assert len(calls) == 1  # not asked again for a minute


async def test_the_backups_process_is_told_before_the_stream_is_used() -> None:
    calls: list[ScriptedCall] = []
    told: list[tuple[str, bool]] = []

    def open_call() -> ScriptedCall:
        calls.append(ScriptedCall())
        return calls[-1]

    def opened(instance: str) -> None:
        told.append((instance, link.ready))

    link = replstream.StreamLink("backup:1", open_call, lambda: 7, 5.0, opened)
    assert link.usable() is None
    calls[-1].answer(opened=paramserver.ReplicateStreamOpened(instance="p1"))
    while not link.ready:
        await asyncio.sleep(0)
    assert told == [("p1", False)]  # no operation could go out on it before


def codec_chunk() -> bytes:
    return codec.chunk_message(0, 0, b"\x00" * 8, 1)


async def test_chunks_reach_the_backup_without_protobuf_and_the_rest_parsed() -> None:
    """What StreamForward writes, read back by the backup's deserializer: a chunk as an
    OpChunk whose data lies in the received bytes; a header as protobuf parses it."""
    calls: list[ScriptedCall] = []
    link = _link(calls)
    call = await _open(link, calls)
    forward = replstream.StreamForward(link, call)
    data = bytes(range(256)) * 3
    header = paramserver.ReplicatePushHeader(
        epoch=7, push=paramserver.PushHeader(job_id="j", step=4, slot=1)
    )
    await forward.write(paramserver.ReplicatePushRequest(header=header))
    await forward.write(codec.chunk_message(2, 4096, data, codec.crc32c(data)))
    read = replstream.request_reader(paramserver.ReplicateStreamRequest.FromString)
    head, chunk = read(call.written[1]), read(call.written[2])
    assert head.op == forward.op and head.push == header
    assert isinstance(chunk, replstream.OpChunk) and chunk.op == forward.op
    c = chunk.chunk
    assert (c.tensor_index, c.offset, c.crc32c) == (2, 4096, codec.crc32c(data))
    assert bytes(c.data) == data and c.data.obj is call.written[2]  # a view, not a copy
    as_protobuf = call.sent(2)  # the same bytes, read by protobuf
    assert as_protobuf.op == chunk.op and as_protobuf.chunk.data == data
    # the same fields serialized by protobuf (another sender) read the same way
    theirs = paramserver.ReplicateStreamRequest(
        op=3, chunk=common.TensorChunk(tensor_index=1, offset=8, data=b"xy", crc32c=5)
    ).SerializeToString()
    got = read(theirs)
    assert isinstance(got, replstream.OpChunk) and got.op == 3
    assert (got.chunk.tensor_index, got.chunk.offset, bytes(got.chunk.data)) == (1, 8, b"xy")
    commit = read(paramserver.ReplicateStreamRequest(op=9, commit=_commit()).SerializeToString())
    assert commit.op == 9 and commit.commit == _commit()
