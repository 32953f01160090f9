"""A CancelledError that grpc.aio raises for a call it cancelled itself (a client stream
whose server died mid-push) is a broken call, retried on the group; a cancellation of
the caller's own task still cancels it."""

from __future__ import annotations

import asyncio

import pytest

from stalwart.client.paramserver import ShardGroupClient
from stalwart.errors import ErrorKind, RpcError


def _client() -> ShardGroupClient:
    client = ShardGroupClient(["a:1", "b:2"], lambda address: None, retry_for_s=5.0)
    client.primary = "a:1"  # no discovery: the attempts below are the whole call
    return client


def test_grpc_cancelled_call_is_retried_as_unavailable() -> None:
    client, tried = _client(), []

    async def attempt(address: str) -> str:
        tried.append(address)
        if len(tried) == 1:
            raise asyncio.CancelledError()  # what grpc.aio raises for its own cancel
        return "applied"

    async def discover() -> str:
        client.primary = "b:2"
        return client.primary

    client.discover = discover  # type: ignore[method-assign]
    assert asyncio.run(client._with_failover(attempt)) == "applied"
    assert tried == ["a:1", "b:2"]  # the broken call forgot the primary and found it again


def test_retries_end_with_unavailable_when_every_call_is_cancelled() -> None:
    client = _client()
    client.retry_for_s = 0.0

    async def attempt(address: str) -> str:
        raise asyncio.CancelledError()

    with pytest.raises(RpcError) as err:
        asyncio.run(client._with_failover(attempt))
    assert err.value.kind is ErrorKind.UNAVAILABLE and "cancelled by grpc" in str(err.value)


def test_cancelling_the_caller_still_cancels() -> None:
    client, started = _client(), asyncio.Event()

    async def attempt(address: str) -> str:
        started.set()
        await asyncio.Event().wait()  # a call that never answers
        return "never"

    async def main() -> None:
        task = asyncio.ensure_future(client._with_failover(attempt))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
