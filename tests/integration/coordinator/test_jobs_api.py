"""Job admission over gRPC: validation, idempotency, paging, nodes and assignments."""

from __future__ import annotations

import asyncio

import pytest

from stalwart.api import common, coordinator
from stalwart.client import CoordinatorClient, NodeSession
from stalwart.errors import ErrorKind, RpcError
from tests.integration.coordinator.support import job_spec, wait_leader

pytestmark = pytest.mark.timeout(240)


# zero counts take the server's defaults (jobspec.normalized): the refused ones are negative
@pytest.mark.parametrize(
    ("changes", "words"),
    [({"model": "no-such-model"}, "unknown model"), ({"num_slots": -1}, "num_slots"),
     ({"steps": -1}, "steps"), ({"lr": float("nan")}, "lr"), ({"lr": -1.0}, "lr")],
)  # fmt: skip
async def test_bad_specs_are_refused(cluster, changes, words):
    c = cluster.coordinator("c1")
    await wait_leader(c.address)
    async with CoordinatorClient(c.address) as client:
        with pytest.raises(RpcError) as info:
            await client.create_job(job_spec(**changes))
        assert info.value.kind is ErrorKind.INVALID_ARGUMENT and words in info.value.message
        assert await client.all_jobs() == []


async def test_filters_outside_their_enum_are_refused(cluster):
    c = cluster.coordinator("c1")
    await wait_leader(c.address)
    async with CoordinatorClient(c.address) as client:
        for call in (client.list_jobs(state=99), client.list_nodes(role=99)):
            with pytest.raises(RpcError) as info:
                await call
            assert info.value.kind is ErrorKind.INVALID_ARGUMENT
            assert "99 is not a known value" in info.value.message
        assert (await client.list_nodes(role=common.NODE_ROLE_TRAINER)).nodes == []


async def test_create_job_is_idempotent_and_pages(cluster):
    c = cluster.coordinator("c1")
    await wait_leader(c.address)
    async with CoordinatorClient(c.address) as client:
        first = await client.create_job(job_spec(), request_id="req-1")
        again = await client.create_job(job_spec(), request_id="req-1")
        assert again.job_id == first.job_id and again.create_time == first.create_time
        # the same request id with something else in it is not a retry
        for other in ({"spec": job_spec(steps=7)}, {"spec": job_spec(), "job_id": "other"}):
            with pytest.raises(RpcError) as info:
                await client.create_job(other["spec"], job_id=other.get("job_id", ""),
                                        request_id="req-1")  # fmt: skip
            assert info.value.kind is ErrorKind.INVALID_ARGUMENT
            assert f"admitted job {first.job_id!r} with another" in info.value.message
        with pytest.raises(RpcError) as info:
            await client.create_job(job_spec(), job_id=first.job_id, request_id="req-2")
        assert info.value.kind is ErrorKind.ALREADY_EXISTS
        for i in range(4):
            await client.create_job(job_spec(), job_id=f"j{i}")
        page = await client.list_jobs(page_size=2)
        assert [j.job_id for j in page.jobs] == [
            "j3",
            "j2",
        ] and page.next_page_token  # newest first
        assert len(await client.all_jobs()) == 5


async def test_trainers_get_slots_and_a_standby_takes_over(cluster):
    c = cluster.coordinator(
        "c1", "--node-lease-seconds", "0.6", "--heartbeat-interval-seconds", "0.1"
    )
    await wait_leader(c.address)
    async with CoordinatorClient(c.address) as client:
        job = await client.create_job(job_spec(num_slots=1))
        worker = NodeSession(client, common.NODE_ROLE_TRAINER, "127.0.0.1:1", node_id="w")
        spare = NodeSession(
            client, common.NODE_ROLE_TRAINER, "127.0.0.1:2", node_id="s", standby=True
        )
        await worker.start()
        await spare.start()
        await worker.beat(), await spare.beat()
        assert worker.assignment.slot == 0 and not worker.assignment.standby
        assert spare.assignment.standby and spare.assignment.job_id == job.job_id
        assert (await client.get_job(job.job_id)).state == coordinator.JOB_STATE_RUNNING
        await worker.stop()  # the worker falls silent: its lease lapses
        for _ in range(100):  # up to 5 s
            await asyncio.sleep(0.05)
            await spare.beat()
            if spare.assignment is not None and not spare.assignment.standby:
                break
        assert spare.assignment.slot == 0 and not spare.assignment.standby
        kinds = []
        async for event in client.watch_events(job_id=job.job_id):
            kinds.append(event.kind)
            if event.kind == common.EVENT_KIND_STANDBY_PROMOTED:
                break
        assert common.EVENT_KIND_SLOT_ASSIGNED in kinds
        await spare.stop()
        drained = await client.drain_node("s")
        assert drained.state in (coordinator.NODE_STATE_DRAINING, coordinator.NODE_STATE_DRAINED)
