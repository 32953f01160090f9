"""Hostile or careless requests to a real coordinator group: refused with a clear status,
nothing applied, and the leader keeps leading.

A made-up epoch deposes nobody, an oversize request is refused before it is
read, enum filters out of range are refused, retried mutations act once, and a
paramserver of the group refuses models of jobs the coordinator never admitted.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
import torch

from stalwart.api import common, coordinator
from stalwart.client import CoordinatorClient
from stalwart.errors import ErrorKind, RpcError
from tests.helpers import assert_eventually_async
from tests.integration.coordinator.support import call, job_spec, status_of, wait_leader
from tests.integration.paramserver.support import (
    consistency,
    model_header,
    push_messages,
    push_raw,
    register_raw,
    sgd,
    stubs,
)
from tests.integration.paramserver.support import (
    status as replica_status,
)

pytestmark = pytest.mark.timeout(240)

Code = grpc.StatusCode


async def _refused(coro, code: grpc.StatusCode, kind: ErrorKind | None = None) -> RpcError:
    with pytest.raises(RpcError) as info:
        await coro
    assert info.value.code == code, repr(info.value)
    if kind is not None:
        assert info.value.kind is kind, repr(info.value)
    return info.value


async def _group(cluster):
    c1 = cluster.coordinator("c1")
    first = await wait_leader(c1.address)
    c2 = cluster.coordinator("c2")
    assert await status_of(c2.address) is not None
    return c1, c2, first


async def _still_leading(address: str, epoch: int) -> None:
    status = await status_of(address)
    assert status is not None and status.is_leader and status.epoch == epoch


async def test_a_made_up_epoch_in_a_heartbeat_deposes_nobody(cluster):
    c1, c2, first = await _group(cluster)
    async with CoordinatorClient([c1.address, c2.address]) as client:
        reg = await client.register_node(common.NODE_ROLE_TRAINER, "127.0.0.1:1", node_id="w")
        beat = coordinator.HeartbeatRequest(node_id="w", epoch=1001, step=-1)
        err = await _refused(call(c1.address, "Heartbeat", beat), Code.FAILED_PRECONDITION,
                             ErrorKind.UNKNOWN_EPOCH)  # fmt: skip
        assert f"epoch 1001 was never issued (the leader's is {first.epoch})" in err.message
        await _still_leading(c1.address, first.epoch)
        ok = await client.heartbeat("w", reg.epoch)
        assert ok.epoch == first.epoch


async def test_an_oversize_create_job_is_refused_and_the_leader_keeps_its_lease(cluster):
    c1, c2, first = await _group(cluster)
    async with CoordinatorClient([c1.address, c2.address]) as client:
        huge = job_spec()
        huge.model_args["blob"] = "x" * (5 << 20)  # 5 MB: over the coordinator's 256 KiB
        request = coordinator.CreateJobRequest(job_id="huge", spec=huge, request_id="r1")
        for _ in range(3):
            sent = time.monotonic()
            err = await _refused(call(c1.address, "CreateJob", request, timeout=30),
                                 Code.RESOURCE_EXHAUSTED)  # fmt: skip
            assert "larger than max" in err.message
            print(f"\n5 MB CreateJob refused after {time.monotonic() - sent:.3f}s")
        # under the receive limit but over a field's limit: refused by validation
        big = job_spec()
        big.model_args["blob"] = "x" * 100_000
        err = await _refused(client.create_job(big, job_id="big"), Code.RESOURCE_EXHAUSTED,
                             ErrorKind.LIMIT_EXCEEDED)  # fmt: skip
        assert "model_args['blob'] is 100000 characters, limit 1024" in err.message
        labels = {"rack": "r" * 5000}
        err = await _refused(
            client.register_node(common.NODE_ROLE_TRAINER, "127.0.0.1:1", node_id="n", labels=labels),
            Code.RESOURCE_EXHAUSTED, ErrorKind.LIMIT_EXCEEDED,
        )  # fmt: skip
        assert "labels" in err.message
        for shard in (-1, 1 << 20):  # -1 passed every `shard < num_shards` test
            err = await _refused(
                client.register_node(common.NODE_ROLE_PARAMSERVER, "127.0.0.1:1", shard=shard),
                Code.INVALID_ARGUMENT,
            )
            assert f"got {shard}" in err.message
        long_reason = coordinator.CancelJobRequest(job_id="none", reason="r" * 5000)
        await _refused(call(c1.address, "CancelJob", long_reason), Code.RESOURCE_EXHAUSTED)
        # nothing applied, and the same leader at the same epoch throughout (a lost
        # lease would have moved leadership to c2, or raised the epoch)
        assert await client.all_jobs() == [] and await client.all_nodes() == []
        await _still_leading(c1.address, first.epoch)


async def test_jobs_past_max_live_jobs_are_refused_until_one_ends(cluster):
    """A script creating jobs in a loop cannot grow the leader's work without end: past
    --max-live-jobs pending or running jobs, CreateJob is refused, nothing is admitted,
    and a job that ends makes room again."""
    c1 = cluster.coordinator("c1", "--max-live-jobs", "2")
    await wait_leader(c1.address)
    async with CoordinatorClient(c1.address) as client:
        for name in ("a", "b"):  # no trainers: both stay pending
            await client.create_job(job_spec(num_slots=1), job_id=name)
        err = await _refused(client.create_job(job_spec(num_slots=1), job_id="c"),
                             Code.RESOURCE_EXHAUSTED, ErrorKind.LIMIT_EXCEEDED)  # fmt: skip
        assert "2 jobs are pending or running" in err.message and "--max-live-jobs" in err.message
        assert sorted(j.job_id for j in await client.all_jobs()) == ["a", "b"]
        await client.cancel_job("a", reason="make room")
        await client.create_job(job_spec(num_slots=1), job_id="c")
        assert sorted(j.job_id for j in await client.all_jobs()) == ["a", "b", "c"]


async def test_enum_filters_out_of_range_are_refused(cluster):
    c1 = cluster.coordinator("c1")
    await wait_leader(c1.address)
    err = await _refused(call(c1.address, "ListJobs", coordinator.ListJobsRequest(state=99)),
                         Code.INVALID_ARGUMENT)  # fmt: skip
    assert "state filter 99" in err.message
    err = await _refused(call(c1.address, "ListNodes", coordinator.ListNodesRequest(role=42)),
                         Code.INVALID_ARGUMENT)  # fmt: skip
    assert "role filter 42" in err.message
    ok = await call(c1.address, "ListJobs",
                    coordinator.ListJobsRequest(state=coordinator.JOB_STATE_RUNNING))  # fmt: skip
    assert list(ok.jobs) == []


async def test_retried_mutations_act_once(cluster):
    c1, c2, first = await _group(cluster)
    async with CoordinatorClient([c1.address, c2.address]) as client:
        job = await client.create_job(job_spec(), job_id="j")
        await client.register_node(common.NODE_ROLE_TRAINER, "127.0.0.1:1", node_id="w")
        for _ in range(2):
            cancelled = await client.cancel_job("j", "first reason", request_id="cancel-1")
            assert (cancelled.state, cancelled.reason) == (
                coordinator.JOB_STATE_CANCELLED,
                "first reason",
            )
        again = await client.cancel_job("j", "another reason", request_id="cancel-1")
        assert again.reason == "first reason" and again.update_time == cancelled.update_time
        # one request id for another job is that job's own request: it is cancelled too
        await client.create_job(job_spec(), job_id="k")
        other = await client.cancel_job("k", "first reason", request_id="cancel-1")
        assert (other.job_id, other.state) == ("k", coordinator.JOB_STATE_CANCELLED)
        for _ in range(2):
            node = await client.drain_node("w", request_id="drain-1")
            assert node.node_id == "w"

        # StepDown: the retry reaches the next leader, which must not step down too
        assert await client.step_down(request_id="sd-1") == first.epoch
        second = await wait_leader(c2.address)
        assert second.epoch > first.epoch
        assert await client.step_down(request_id="sd-1") == first.epoch
        await _still_leading(c2.address, second.epoch)
        assert (await client.get_job(job.job_id)).state == coordinator.JOB_STATE_CANCELLED


async def test_paramserver_refuses_models_of_jobs_never_admitted(cluster):
    coord = cluster.coordinator("c1")
    await wait_leader(coord.address)
    ps = cluster.paramserver("ps", "--role", "primary", "--coordinator", coord.address)
    initial = {"w": torch.zeros(4)}

    def header(job_id: str):
        return model_header(job_id, initial, sgd(0.1), consistency("sync"), num_slots=2)

    async with CoordinatorClient(coord.address) as client, stubs() as stub_for:

        async def registered():
            assert [n.node_id for n in await client.all_nodes()] == ["ps"]

        await assert_eventually_async(registered, timeout=30)
        err = await _refused(register_raw(stub_for(ps.address), header("ghost"), initial),
                             Code.NOT_FOUND, ErrorKind.UNKNOWN_JOB)  # fmt: skip
        assert "never admitted by the coordinator" in err.message
        await client.create_job(job_spec(num_slots=2), job_id="real")
        reply = await register_raw(stub_for(ps.address), header("real"), initial)
        assert reply.version == 0

        # one committed step on the leader's books: a replica that does not hold the
        # job (a primary restarted empty) must not take fresh weights for it
        grads = {"w": torch.ones(4)}
        await asyncio.gather(*(push_raw(stub_for(ps.address), push_messages("real", 0, k, grads))
                               for k in (0, 1)))  # fmt: skip

        async def committed():
            assert (await client.get_job("real")).step == 1

        await assert_eventually_async(committed, timeout=30)
        # (another shard: in the same one the leader would make it a backup of "ps")
        fresh = cluster.paramserver(
            "ps-fresh", "--role", "primary", "--shard", "1", "--coordinator", coord.address
        )

        async def refused_fresh():  # (a first connection under load may be refused)
            err = await _refused(register_raw(stub_for(fresh.address), header("real"), initial),
                                 Code.FAILED_PRECONDITION, ErrorKind.FAILED_PRECONDITION)  # fmt: skip
            assert "1 committed steps that this replica does not hold" in err.message

        await assert_eventually_async(refused_fresh, timeout=30)
        assert (await replica_status(stub_for(fresh.address))).jobs == []  # nothing taken
