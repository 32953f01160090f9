"""Channels from open_channel / open_sync_channel send the role token on calls of
every type (unary, server-, client- and bidirectional streaming), to a real
in-process gRPC server that records what each call carried; and refuse a unary
call without a deadline."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from stalwart.auth import AUTH_HEADER
from stalwart.channel import open_channel, open_sync_channel

SERVICE = "test.Tokens"


def _same(message: bytes) -> bytes:
    return message


class _Recorder:
    """Handlers of each call type that note the authorization header they saw."""

    def __init__(self) -> None:
        self.seen: dict[str, str | None] = {}

    def _note(self, method: str, context) -> None:
        self.seen[method] = dict(context.invocation_metadata()).get(AUTH_HEADER)

    async def unary_unary(self, request, context):
        self._note("UnaryUnary", context)
        return request

    async def unary_stream(self, request, context):
        self._note("UnaryStream", context)
        yield request

    async def stream_unary(self, requests, context):
        self._note("StreamUnary", context)
        return b"".join([r async for r in requests])

    async def stream_stream(self, requests, context):
        self._note("StreamStream", context)
        async for request in requests:
            yield request

    def handler(self) -> grpc.GenericRpcHandler:
        kinds = {
            "UnaryUnary": grpc.unary_unary_rpc_method_handler(self.unary_unary, _same, _same),
            "UnaryStream": grpc.unary_stream_rpc_method_handler(self.unary_stream, _same, _same),
            "StreamUnary": grpc.stream_unary_rpc_method_handler(self.stream_unary, _same, _same),
            "StreamStream": grpc.stream_stream_rpc_method_handler(self.stream_stream, _same, _same),
        }
        return grpc.method_handlers_generic_handler(SERVICE, kinds)


async def _serve(recorder: _Recorder) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((recorder.handler(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


async def _every_type_async(address: str, token: str | None) -> None:
    async with open_channel(address, role_token=token) as channel:
        path = f"/{SERVICE}/"
        assert await channel.unary_unary(path + "UnaryUnary", _same, _same)(b"a", timeout=5)
        assert [m async for m in channel.unary_stream(path + "UnaryStream", _same, _same)(b"b")]
        assert await channel.stream_unary(path + "StreamUnary", _same, _same)(iter([b"c"]))
        call = channel.stream_stream(path + "StreamStream", _same, _same)()
        await call.write(b"d")
        assert await call.read() == b"d"
        await call.done_writing()


@pytest.mark.parametrize("token", ["node-token", None], ids=["token", "none"])
def test_an_aio_channel_sends_its_token_on_every_call_type(token: str | None) -> None:
    recorder = _Recorder()

    async def run() -> None:
        server, address = await _serve(recorder)
        try:
            await _every_type_async(address, token)
        finally:
            await server.stop(None)

    asyncio.run(run())
    expected = f"Bearer {token}" if token else None
    assert recorder.seen == dict.fromkeys(
        ("UnaryUnary", "UnaryStream", "StreamUnary", "StreamStream"), expected
    )


def test_a_sync_channel_sends_its_token_on_every_call_type() -> None:
    recorder = _Recorder()

    async def run() -> None:
        server, address = await _serve(recorder)
        try:
            await asyncio.to_thread(_every_type_sync, address)
        finally:
            await server.stop(None)

    asyncio.run(run())
    assert recorder.seen == dict.fromkeys(
        ("UnaryUnary", "UnaryStream", "StreamUnary", "StreamStream"), "Bearer adm-token"
    )


def _every_type_sync(address: str) -> None:
    with open_sync_channel(address, role_token="adm-token") as channel:
        path = f"/{SERVICE}/"
        assert channel.unary_unary(path + "UnaryUnary", _same, _same)(b"a", timeout=5)
        assert list(channel.unary_stream(path + "UnaryStream", _same, _same)(b"b", timeout=5))
        assert channel.stream_unary(path + "StreamUnary", _same, _same)(iter([b"c"]), timeout=5)
        answers = channel.stream_stream(path + "StreamStream", _same, _same)(
            iter([b"d"]), timeout=5
        )
        assert list(answers) == [b"d"]


def test_a_unary_call_without_a_deadline_is_refused() -> None:
    async def run() -> None:
        async with open_channel("127.0.0.1:1", role_token="node-token") as channel:
            with pytest.raises(ValueError, match="every call needs a deadline"):
                await channel.unary_unary(f"/{SERVICE}/UnaryUnary", _same, _same)(b"a")

    asyncio.run(run())
