"""ShardGroupClient.follow: the coordinator names a promoted backup, and calls under way
to the old primary, which may hang rather than refuse them, are sent to it at once."""

from __future__ import annotations

import asyncio

import pytest

from stalwart.api import coordinator
from stalwart.client.paramserver import ParamServerClient, ShardGroupClient


def _client() -> ShardGroupClient:
    client = ShardGroupClient(["a:1", "b:2"], lambda address: None, retry_for_s=60.0)
    client.primary, client.epoch = "a:1", 3
    return client


def _hanging_on(address: str, tried: list[tuple[str, int]], client: ShardGroupClient):
    """An attempt that never answers at ``address`` (a stopped process) and answers
    anywhere else with the epoch it was sent with."""

    async def attempt(to: str) -> tuple[str, int]:
        tried.append((to, client.epoch))
        if to == address:
            await asyncio.Event().wait()
        return to, client.epoch

    return attempt


async def _started(tried: list) -> None:
    while not tried:
        await asyncio.sleep(0)


def test_a_call_hanging_on_the_old_primary_is_sent_to_the_new_one():
    client, tried = _client(), []

    async def main():
        call = asyncio.ensure_future(client._with_failover(_hanging_on("a:1", tried, client)))
        await _started(tried)
        client.follow("b:2", 4)
        return await asyncio.wait_for(call, 60)  # a guard: the call would wait for ever

    assert asyncio.run(main()) == ("b:2", 4)
    assert tried == [("a:1", 3), ("b:2", 4)]  # no search in between: the map said where


@pytest.mark.parametrize(
    ("primary", "epoch"),
    [("a:1", 4), ("b:2", 2), ("c:3", 9)],  # the same replica; an older map; a stranger
)
def test_calls_are_not_cut_for_a_map_that_names_nothing_newer_here(primary, epoch):
    client, tried, answer = _client(), [], asyncio.Event()

    async def attempt(to: str) -> str:
        tried.append(to)
        await answer.wait()
        return to

    async def main():
        call = asyncio.ensure_future(client._with_failover(attempt))
        await _started(tried)
        client.follow(primary, epoch)
        for _ in range(10):
            await asyncio.sleep(0)
        assert not call.done()
        answer.set()
        return await asyncio.wait_for(call, 60)

    assert asyncio.run(main()) == "a:1"
    assert tried == ["a:1"]


def test_cancelling_the_caller_still_cancels_a_call_being_followed():
    client, tried = _client(), []

    async def main():
        call = asyncio.ensure_future(client._with_failover(_hanging_on("a:1", tried, client)))
        await _started(tried)
        call.cancel()
        client.follow("b:2", 4)  # in the same turn: the caller's cancel wins
        with pytest.raises(asyncio.CancelledError):
            await call

    asyncio.run(main())
    assert tried == [("a:1", 3)]


def test_the_whole_client_follows_each_group_by_shard():
    groups = [
        ShardGroupClient(["a:1", "b:2"], lambda address: None),
        ShardGroupClient(["c:3", "d:4"], lambda address: None),
    ]
    client = ParamServerClient(groups)
    shard_map = [
        coordinator.ShardGroup(shard=1, primary_address="d:4", epoch=5),
        coordinator.ShardGroup(shard=0, primary_address="a:1", epoch=2),
    ]
    client.follow(shard_map)
    assert [(g.primary, g.epoch) for g in groups] == [("a:1", 2), ("d:4", 5)]
