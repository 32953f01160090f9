"""A primary that hangs instead of dying: ShardGroupClient.follow sends the calls under
way to the backup a new shard map names, and a search for the primary does not wait
for a replica that never answers."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from stalwart.api import common, coordinator, paramserver
from stalwart.client.paramserver import ParamServerClient, ShardGroupClient
from stalwart.errors import ErrorKind, RpcError


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


def _statuses(answers: dict[str, tuple[int, int] | None], asked: list[str]):
    """A status call per replica: (role, epoch) answered at once, None hangs."""

    async def status(address: str) -> paramserver.GetReplicaStatusResponse:
        asked.append(address)
        if answers[address] is None:
            await asyncio.Event().wait()
        role, epoch = answers[address]
        return paramserver.GetReplicaStatusResponse(role=role, epoch=epoch)

    return status


PRIMARY, BACKUP = common.REPLICA_ROLE_PRIMARY, common.REPLICA_ROLE_BACKUP


def test_a_search_does_not_wait_for_a_replica_that_hangs():
    client = ShardGroupClient(["a:1", "b:2", "c:3"], lambda address: None)
    asked: list[str] = []
    client.status = _statuses(  # type: ignore[method-assign]
        {"a:1": None, "b:2": (PRIMARY, 4), "c:3": (BACKUP, 4)}, asked
    )
    found = asyncio.run(asyncio.wait_for(client.discover(), 60))  # a guard, not a timing
    assert found == "b:2" and client.epoch == 4
    assert sorted(asked) == ["a:1", "b:2", "c:3"]


def test_the_highest_epoch_among_the_answers_wins():
    client = ShardGroupClient(["a:1", "b:2", "c:3"], lambda address: None)
    client.status = _statuses(  # type: ignore[method-assign]
        {"a:1": (PRIMARY, 3), "b:2": (PRIMARY, 5), "c:3": (BACKUP, 5)}, []
    )
    assert asyncio.run(client.discover()) == "b:2" and client.epoch == 5


def test_no_primary_among_the_answers_is_unavailable():
    client = ShardGroupClient(["a:1", "b:2"], lambda address: None)

    async def status(address: str):
        if address == "a:1":
            raise RpcError(grpc.StatusCode.UNAVAILABLE, "refused")
        return paramserver.GetReplicaStatusResponse(role=BACKUP, epoch=2)

    client.status = status  # type: ignore[method-assign]
    with pytest.raises(RpcError) as err:
        asyncio.run(client.discover())
    assert err.value.kind is ErrorKind.UNAVAILABLE
