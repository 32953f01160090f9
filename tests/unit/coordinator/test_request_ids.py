"""Idempotency keys and the leader lease's own thread, against a real shm:// store."""

from __future__ import annotations

import asyncio
import time

import pytest

from services.coordinator.control import Control
from services.coordinator.election import Election
from services.coordinator.leader import LeaderState, Role
from services.coordinator.settings import CoordinatorSettings
from services.coordinator.statestore import StateStore
from stalwart.stores import open_store
from tests.helpers import assert_eventually_async
from tests.unit.coordinator.leaders import holding_lease


async def _leader(url: str, epoch: int) -> Control:
    control = holding_lease(url, epoch)
    await control.take_over(epoch)
    return control


def test_a_request_id_runs_once_also_on_the_next_leader(tmp_path):
    url = f"shm://{tmp_path}/state"
    runs: list[str] = []

    async def run():
        runs.append("ran")
        await asyncio.sleep(0.05)  # long enough for the concurrent retry to arrive
        return "ckpt-1"

    async def decode(raw: bytes):
        return "found " + raw.decode()

    async def scenario():
        first = await _leader(url, 1)
        answers = await asyncio.gather(*(first.once("M", "r1", run, str.encode, decode)
                                          for _ in range(3)))  # fmt: skip
        assert answers == ["ckpt-1"] * 3 and runs == ["ran"]
        assert await first.once("M", "r1", run, str.encode, decode) == "found ckpt-1"
        assert await first.once("Other", "r1", run, str.encode, decode) == "ckpt-1"
        second = await _leader(url, 2)  # took over: its store holds the answers
        assert await second.once("M", "r1", run, str.encode, decode) == "found ckpt-1"
        assert runs == ["ran", "ran"]  # only "Other" ran a second time

    asyncio.run(scenario())


def test_a_failed_call_is_not_remembered(tmp_path):
    control_url = f"shm://{tmp_path}/state"
    calls = []

    async def scenario():
        control = await _leader(control_url, 1)

        async def boom():
            calls.append(1)
            raise RuntimeError("no")

        for _ in range(2):
            with pytest.raises(RuntimeError):
                await control.once("M", "r1", boom, str.encode, None)
        assert len(calls) == 2

    asyncio.run(scenario())


def test_the_lease_is_renewed_while_the_event_loop_is_blocked(tmp_path):
    """A handler that holds the event loop (a huge request, a slow parse) for longer than
    the lease TTL: the renewal thread keeps the lease, so the leader keeps acting."""
    url = f"shm://{tmp_path}/state"
    settings = CoordinatorSettings(store_url=url, leader_ttl_seconds=3.0,
                                   leader_renew_seconds=0.5, leader_margin_seconds=0.5)  # fmt: skip
    state = StateStore(open_store(url), "t")
    leader = LeaderState(settings.leader_ttl_seconds, settings.leader_margin_seconds)
    elected: list[int] = []

    async def on_elected(epoch: int) -> None:
        elected.append(epoch)

    election = Election(state, leader, "c1@127.0.0.1:1", settings, on_elected, lambda: None)

    async def scenario():
        task = asyncio.create_task(election.run())

        async def was_elected():
            assert elected == [1]

        await assert_eventually_async(was_elected, timeout=30)
        time.sleep(3 * settings.leader_ttl_seconds)  # the loop does nothing else meanwhile
        assert leader.role is Role.LEADER and leader.acting(time.monotonic())
        current = state.store.get_lease(state.lease_name)
        assert current is not None and current.holder == "c1@127.0.0.1:1"
        await election.stop()
        task.cancel()

    asyncio.run(scenario())


def test_request_ids_are_honoured_within_the_retention_and_deleted_after_it(tmp_path):
    now = [1_000_000.0]
    state = StateStore(open_store(f"shm://{tmp_path}/state"), "t", retention_s=60.0,
                       clock=lambda: now[0])  # fmt: skip
    state.take_over(1)
    assert state.put_request(1, "create-a", "job-a") == "job-a"
    assert state.put_request(1, "create-a", "job-other") == "job-a"  # the first one stays
    assert state.put_answer(1, "Drain/r1", b"node-7\nwith a newline") == b"node-7\nwith a newline"
    now[0] += 30.0
    assert state.trim_request_ids(1) == 0
    assert state.request_job("create-a").job_id == "job-a"
    assert state.answer("Drain/r1") == b"node-7\nwith a newline"
    state.put_answer(1, "Drain/r2", b"node-8")  # younger: survives the next sweep
    now[0] += 31.0
    assert state.trim_request_ids(1) == 2
    assert state.request_job("create-a") is None
    assert state.answer("Drain/r1") is None
    assert state.answer("Drain/r2") == b"node-8"


def test_request_id_writes_expire_old_ones_listing_them_once_per_epoch(tmp_path):
    now = [0.0]
    url = f"shm://{tmp_path}/state"
    before = StateStore(open_store(url), "t", retention_s=10.0, clock=lambda: now[0])
    before.take_over(1)
    before.put_answer(1, "by-the-last-leader", b"x")
    store = _CountingLists(open_store(url))
    state = StateStore(store, "t", retention_s=10.0, clock=lambda: now[0])
    state.take_over(2)
    now[0] = 5.0
    state.put_answer(2, "mine", b"y")
    now[0] = 16.0  # both older than 10 s now
    for i in range(200):
        state.put_answer(2, f"new-{i}", b"z")
    assert state.answer("by-the-last-leader") is None  # found by the epoch's one listing
    assert state.answer("mine") is None  # expired from what this leader wrote
    assert state.answer("new-199") == b"z"
    assert store.lists == 2  # requests/ and answers/, once, not once per write
    state.take_over(3)
    state.put_answer(3, "after", b"w")
    assert store.lists == 4  # a new epoch lists again: other leaders may have written


class _CountingLists:
    """A real store that counts its kv_list calls."""

    def __init__(self, store):
        self._store = store
        self.lists = 0

    def kv_list(self, prefix):
        self.lists += 1
        return self._store.kv_list(prefix)

    def __getattr__(self, name):
        return getattr(self._store, name)
