"""The server side of PushStream (docs/paramserver.md, "Pushes on one open call"): the
calls being served, ended at shutdown, and one push's messages read off a call that
goes on with the next. The pushes themselves are the servicer's Push code."""

from __future__ import annotations

import asyncio
import contextlib

import grpc

from stalwart import codec, limits
from stalwart.errors import ErrorKind, StalwartError
from stalwart.server import DRAIN_BEFORE_REFUSAL_S


class _Served:
    """One PushStream call being served: ``closing`` once shutdown began."""

    def __init__(self, context, closing: bool):
        self.context = context
        self.closing = closing
        self.waiting = False  # for the next push's header, between pushes

    async def next_message(self):
        self.waiting = True
        try:
            return await self.context.read()
        finally:
            self.waiting = False


class PushStreams:
    """The PushStream calls being served. At shutdown each ends: at once, UNAVAILABLE,
    when it waits between pushes, else once its push is answered (within the grace).
    Open, they would hold the server's stop for its whole grace."""

    def __init__(self) -> None:
        self._open: set[_Served] = set()
        self._closing = False

    @contextlib.contextmanager
    def track(self, context):
        """The call, served until the block ends. LIMIT_EXCEEDED past
        ``limits.MAX_PUSH_STREAMS`` open at once: each holds a call and a task, and a
        client refused here pushes with Push calls instead."""
        limits.check_open(
            "push streams", len(self._open), limits.MAX_PUSH_STREAMS, "push with Push calls"
        )
        stream = _Served(context, self._closing)
        self._open.add(stream)
        try:
            yield stream
        finally:
            self._open.discard(stream)

    async def close(self) -> None:
        self._closing = True
        status = StalwartError(ErrorKind.UNAVAILABLE, "the replica is shutting down").to_status()
        for stream in list(self._open):
            stream.closing = True
            if stream.waiting:
                # ends the call with this status; its handler's read raises AbortError
                with contextlib.suppress(grpc.aio.AbortError):
                    await stream.context.abort_with_status(status)


class OnePush:
    """One push's messages on a PushStream: ``first`` (its header), then what the
    call reads next, until the reader stops asking (at the push's last chunk)."""

    def __init__(self, first, context):
        self._first = first
        self._context = context
        self._header = None if codec.chunk_of(first) is not None else first.header
        self._received = 0  # bytes of chunk data read after the header

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self._first is not None:
            first, self._first = self._first, None
            return first
        message = await self._context.read()
        if message is grpc.aio.EOF:
            raise StopAsyncIteration
        chunk = codec.chunk_of(message)
        if chunk is not None:
            self._received += len(chunk.data)
        return message

    async def drain(self) -> None:
        """Before a refusal: read what is left of this push, as far as its header's
        specs say (at most DRAIN_BEFORE_REFUSAL_S). A grpcio client whose write fails
        after the status arrived reports INTERNAL instead of it (docs/api.md); the
        next push's header is not sent before this one is answered, so nothing else
        is read here."""
        try:
            expected = sum(codec.tensor_nbytes(spec) for spec in self._header.tensors)
        except Exception:  # no header, or specs that name no size: nothing to go by
            return

        async def rest() -> None:
            async for _ in self:
                if self._received >= expected:
                    return

        if self._received < expected:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(rest(), DRAIN_BEFORE_REFUSAL_S)
