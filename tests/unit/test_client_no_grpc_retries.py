"""A call refused with UNAVAILABLE reaches the replica once: the coordinator client
and a shard group client move on to another replica themselves, so gRPC must not
retry the call there first. Against a real in-process gRPC server that refuses
every call and counts them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine

import grpc
import pytest

from stalwart.api import coordinator
from stalwart.client.coordinator import CoordinatorClient
from stalwart.client.paramserver import ShardGroupClient
from stalwart.errors import ErrorKind, RpcError

# The long deadline leaves gRPC's own retries (four attempts, backoffs up to 0.7 s)
# room to happen, were they on.
DEADLINE_S = 10.0


class _Refusing:
    """Answers one method with UNAVAILABLE (a replica going down) and counts."""

    def __init__(self, service: str, method: str) -> None:
        self.service, self.method = service, method
        self.calls = 0

    async def refuse(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        self.calls += 1
        await context.abort(grpc.StatusCode.UNAVAILABLE, "shutting down")

    def handler(self) -> grpc.GenericRpcHandler:
        method = grpc.unary_unary_rpc_method_handler(self.refuse)
        return grpc.method_handlers_generic_handler(self.service, {self.method: method})


def _refused(refusing: _Refusing, call: Callable[[str], Coroutine]) -> RpcError:
    """Serve ``refusing`` and return the error ``call(address)`` raised."""

    async def run() -> RpcError:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((refusing.handler(),))
        address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        await server.start()
        try:
            with pytest.raises(RpcError) as raised:
                await call(address)
            return raised.value
        finally:
            await server.stop(None)

    return asyncio.run(run())


@pytest.mark.parametrize("blocking", [False, True], ids=["aio", "blocking"])
def test_the_coordinator_client_asks_an_unavailable_replica_once(blocking: bool) -> None:
    refusing = _Refusing("stalwart.v1.CoordinatorService", "GetClusterStatus")

    async def call(address: str) -> None:
        client = CoordinatorClient([address, "127.0.0.1:1"], blocking=blocking)
        once = client._once(address, "GetClusterStatus", coordinator.GetClusterStatusRequest(),
                            DEADLINE_S)  # fmt: skip
        if blocking:  # a blocking call would hold the loop the server runs on
            once = asyncio.to_thread(asyncio.run, once)
        try:
            await once
        finally:
            await client.close()

    err = _refused(refusing, call)
    assert err.kind is ErrorKind.UNAVAILABLE
    assert refusing.calls == 1


def test_a_shard_group_client_asks_an_unavailable_replica_once() -> None:
    refusing = _Refusing("stalwart.v1.ParamServerService", "GetReplicaStatus")

    async def call(address: str) -> None:
        group = ShardGroupClient([address], call_timeout_s=DEADLINE_S)
        try:
            await group.status(address)
        finally:
            await group.close()

    err = _refused(refusing, call)
    assert err.kind is ErrorKind.UNAVAILABLE
    assert refusing.calls == 1
