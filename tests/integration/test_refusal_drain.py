"""A client-streaming call refused before its end still reaches the client with the
status the server sent. grpc.aio clients whose write fails after the status arrived
report INTERNAL instead (grpc/grpc#36066); ``drain_on_refusal`` reads the rest of the
request stream before refusing. A real grpc.aio server and client on loopback."""

from __future__ import annotations

import grpc
import pytest

from stalwart.errors import ErrorKind, StalwartError
from stalwart.server import drain_on_refusal

MESSAGE = b"x" * (4 << 20)
LIMIT = [("grpc.max_receive_message_length", 8 << 20), ("grpc.max_send_message_length", 8 << 20)]


class Refuser:
    @drain_on_refusal
    async def Register(self, request_iterator, context):
        await anext(aiter(request_iterator))  # the header, then refuse
        raise StalwartError(ErrorKind.UNKNOWN_JOB, "job 'ghost' was never admitted")


async def test_every_refusal_arrives_as_sent_while_the_client_still_writes() -> None:
    refuser = Refuser()
    server = grpc.aio.server(options=LIMIT)
    handler = grpc.stream_unary_rpc_method_handler(refuser.Register)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("t.T", {"R": handler})])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    codes = []
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=LIMIT) as channel:
            call = channel.stream_unary("/t.T/R")
            for _ in range(40):  # without the drain, about one in eight came back INTERNAL
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await call(iter([b"header"] + [MESSAGE] * 6), timeout=30)
                codes.append((refused.value.code(), refused.value.details()))
    finally:
        await server.stop(None)
    assert set(codes) == {(grpc.StatusCode.NOT_FOUND, "job 'ghost' was never admitted")}
