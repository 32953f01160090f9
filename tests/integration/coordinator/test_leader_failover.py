"""Two coordinator replicas on one store: who leads, failover, and a deposed leader."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from services.coordinator.settings import CoordinatorSettings
from services.coordinator.statestore import Fenced, StateStore
from stalwart.api import coordinator
from stalwart.client import CoordinatorClient
from stalwart.errors import ErrorKind, RpcError
from stalwart.stores import open_store
from tests.helpers import assert_eventually_async
from tests.integration.coordinator.support import call, job_spec, status_of, wait_leader

pytestmark = pytest.mark.timeout(240)

TTL_S = CoordinatorSettings().leader_ttl_seconds  # the default the processes run with


async def _two(cluster):
    first = cluster.coordinator("c1")
    await wait_leader(first.address)
    second = cluster.coordinator("c2")
    return first, second


async def test_standby_answers_not_leader_with_the_leaders_address(cluster):
    leader, standby = await _two(cluster)
    with pytest.raises(RpcError) as info:
        await call(standby.address, "ListJobs", coordinator.ListJobsRequest())
    assert info.value.kind is ErrorKind.NOT_LEADER
    assert info.value.metadata["leader"] == leader.address
    status = await status_of(standby.address)
    assert not status.is_leader and status.leader_address == leader.address
    # the client follows the hint to the leader
    async with CoordinatorClient([standby.address, leader.address]) as client:
        job = await client.create_job(job_spec())
        assert client.leader == leader.address
        assert (await client.get_job(job.job_id)).job_id == job.job_id


async def _failover_after_kill(cluster, limit_s: float) -> None:
    leader, standby = await _two(cluster)
    async with CoordinatorClient([leader.address, standby.address]) as client:
        job = await client.create_job(job_spec(), job_id="kept")
        before = (await client.cluster_status()).epoch
        started = time.monotonic()
        leader.kill()
        status = await wait_leader(standby.address, timeout=10)
        took = time.monotonic() - started
        print(f"\nfailover after kill -9 on {cluster.store_url.split(':')[0]}: {took:.2f}s")
        assert took < limit_s
        assert status.epoch > before
        again = await client.get_job(job.job_id)  # the stored job, from the new leader
        assert again.spec == job.spec and client.leader == standby.address
        events = []
        async for event in client.watch_events():
            events.append(event)
            if event.kind == 9 and event.attributes.get("epoch") == str(status.epoch):
                break  # LEADER_ELECTED of the new leader: the stream spans both leaders
        assert [e.sequence for e in events] == sorted({e.sequence for e in events})


async def test_kill_leader_standby_takes_over_with_the_stored_jobs(cluster):
    await _failover_after_kill(cluster, limit_s=2.0)


async def test_kill_leader_on_redis(redis_cluster):
    # Redis has no process-bound lock: the lease must lapse (its TTL) first.
    await _failover_after_kill(redis_cluster, limit_s=TTL_S + 1.5)


async def test_deposed_leader_cannot_command(cluster):
    leader, standby = await _two(cluster)
    old_epoch = (await status_of(leader.address)).epoch
    os.killpg(leader.pid, signal.SIGSTOP)
    try:
        new = await wait_leader(standby.address, timeout=10)
        # A request queued at the frozen leader runs when it wakes: it must be refused.
        pending = asyncio.create_task(
            call(leader.address, "CreateJob",
                 coordinator.CreateJobRequest(job_id="from-the-past", spec=job_spec()), timeout=10)
        )  # fmt: skip
        await asyncio.sleep(0.3)
    finally:
        os.killpg(leader.pid, signal.SIGCONT)
    with pytest.raises(RpcError) as info:
        await pending
    assert info.value.kind is ErrorKind.NOT_LEADER
    assert new.epoch > old_epoch

    async def woke_as_standby():
        woke = await status_of(leader.address)
        assert not woke.is_leader and woke.leader_address == standby.address
        assert woke.epoch == new.epoch  # it learned the new epoch from the lease

    await assert_eventually_async(woke_as_standby, timeout=3)
    async with CoordinatorClient([standby.address]) as client:
        assert "from-the-past" not in [j.job_id for j in await client.all_jobs()]
    # and a write under the old epoch is refused by the store itself
    with open_store(cluster.store_url) as store:
        state = StateStore(store, cluster.prefix)
        with pytest.raises(Fenced):
            state.put_job(old_epoch, coordinator.Job(job_id="from-the-past"))
        assert store.kv_get(state.key("jobs/from-the-past")) is None


async def test_step_down_hands_over(cluster):
    leader, standby = await _two(cluster)
    async with CoordinatorClient([leader.address, standby.address]) as client:
        held = await client.step_down()
        status = await wait_leader(standby.address, timeout=5)
        assert status.epoch > held
