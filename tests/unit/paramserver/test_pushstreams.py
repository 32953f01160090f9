"""The PushStream calls a replica serves (services/paramserver/pushstreams.py): bounded
in number, and ended at shutdown, at once when waiting between pushes (UNAVAILABLE)
and after its push when one is in flight."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from services.paramserver.pushstreams import PushStreams
from stalwart import limits
from stalwart.errors import ErrorKind, StalwartError


class _Context:
    """What PushStreams uses of a servicer context: read, and abort with a status."""

    def __init__(self) -> None:
        self.messages: asyncio.Queue = asyncio.Queue()
        self.aborted = None

    async def read(self):
        return await self.messages.get()

    async def abort_with_status(self, status):
        self.aborted = status
        raise grpc.aio.AbortError()


def test_calls_past_the_limit_are_refused_until_one_ends(monkeypatch) -> None:
    monkeypatch.setattr(limits, "MAX_PUSH_STREAMS", 2)
    streams = PushStreams()
    with streams.track(_Context()), streams.track(_Context()) as second:
        with pytest.raises(StalwartError) as refused:
            with streams.track(_Context()):
                pass
        assert refused.value.kind is ErrorKind.LIMIT_EXCEEDED
        assert "2 push streams open already" in str(refused.value)
        assert not second.closing
    with streams.track(_Context()) as again:
        assert again is not None


def test_shutdown_ends_a_waiting_call_at_once_and_a_busy_one_after_its_push() -> None:
    async def scenario() -> None:
        streams = PushStreams()
        waiting_context, busy_context = _Context(), _Context()
        with streams.track(waiting_context) as waiting, streams.track(busy_context) as busy:
            reading = asyncio.ensure_future(waiting.next_message())
            await asyncio.sleep(0)  # the waiting call is now in its read
            assert waiting.waiting and not busy.waiting
            await streams.close()
            assert waiting.closing and busy.closing
            assert waiting_context.aborted is not None  # UNAVAILABLE, ended at once
            assert waiting_context.aborted.code == grpc.StatusCode.UNAVAILABLE
            assert busy_context.aborted is None  # its push is answered first
            reading.cancel()
        with streams.track(_Context()) as late:  # opened after shutdown began
            assert late.closing

    asyncio.run(scenario())
