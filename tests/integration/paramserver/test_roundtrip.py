"""Register, push and pull through a real primary + backup, and across two shard groups."""

from __future__ import annotations

import asyncio

import grpc
import pytest
import torch

from stalwart import shardmap
from stalwart.client import ParamServerClient
from tests.helpers import assert_eventually_async
from tests.integration.paramserver.support import (
    assert_same_state,
    consistency,
    expect_error,
    group_client,
    metric,
    model_header,
    pull_raw,
    sgd,
    stubs,
)

pytestmark = pytest.mark.timeout(180)


def _initial() -> dict[str, torch.Tensor]:
    return {
        "w": torch.arange(12, dtype=torch.float32).reshape(3, 4),
        "b": torch.zeros(4),
    }


async def test_register_push_pull_and_deltas(shared_groups) -> None:
    group = shared_groups[0]
    job = "roundtrip"
    client = group_client(group.addresses)
    async with stubs() as stub_for:
        try:
            init = _initial()
            await client.register_model(_header(job, init), list(init.values()))
            state = await assert_same_state(stub_for, group.replicas, job)
            assert state.version == 0
            version, pulled = await client.pull(job)
            assert version == 0 and set(pulled) == {"w", "b"}
            assert torch.equal(pulled["w"], init["w"]) and torch.equal(pulled["b"], init["b"])

            # step 0: both tensors; SGD lr=0.5 on these values is exact
            r = await client.push(job, 0, 0, 0, {"w": torch.ones(3, 4), "b": torch.full((4,), 2.0)})
            assert (r.version, r.duplicate) == (1, False)
            assert (await assert_same_state(stub_for, group.replicas, job)).version == 1
            version, pulled = await client.pull(job)
            assert version == 1
            assert torch.equal(pulled["w"], init["w"] - 0.5)
            assert torch.equal(pulled["b"], torch.full((4,), -1.0))

            # step 1 touches only b: a pull since version 1 carries b alone
            r = await client.push(job, 1, 0, 1, {"b": torch.ones(4)})
            assert r.version == 2
            assert (await assert_same_state(stub_for, group.replicas, job)).version == 2
            version, delta = await client.pull(job, since_version=1)
            assert version == 2 and set(delta) == {"b"}
            assert torch.equal(delta["b"], torch.full((4,), -1.5))
            version, nothing = await client.pull(job, since_version=2)
            assert (version, nothing) == (2, {})
            version, everything = await client.pull(job, since_version=0)
            assert set(everything) == {"w", "b"}
            assert torch.equal(everything["w"], init["w"] - 0.5)

            # a pull for a version not reached yet waits for the push that makes it
            primary = group.primary
            stub = stub_for(primary.address)
            started = metric(primary, "grpc_server_started_total", grpc_method="Pull")
            waiting = asyncio.create_task(pull_raw(stub, job, since_version=2, min_version=3))

            async def pull_is_waiting():
                now = await asyncio.to_thread(
                    metric, primary, "grpc_server_started_total", grpc_method="Pull"
                )
                assert now == started + 1 and not waiting.done()

            await assert_eventually_async(pull_is_waiting, timeout=10)
            r = await client.push(job, 2, 0, 2, {"w": torch.full((3, 4), 2.0)})
            assert r.version == 3
            version, delta = await asyncio.wait_for(waiting, 10)
            assert version == 3 and set(delta) == {"w"}
            assert torch.equal(delta["w"], init["w"] - 1.5)
            assert (await assert_same_state(stub_for, group.replicas, job)).version == 3

            # ... and gives up at its deadline when the version never comes
            await expect_error(
                pull_raw(stub, job, min_version=99, timeout=0.5),
                grpc.StatusCode.DEADLINE_EXCEEDED,
                "DEADLINE_EXCEEDED",
            )
        finally:
            await client.close()


def _header(job: str, params):
    return model_header(job, params, sgd(0.5), consistency("async"), num_slots=1)


class _SmallSplitClient(ParamServerClient):
    """Splits tensors of 64 bytes and more by rows, so small tensors exercise the split
    (the default threshold, 8 MiB, would make this test slow on two cores)."""

    def plan(self, params):
        shapes = shardmap.shapes_of(params)
        self.pieces = shardmap.build_shard_map(shapes, self.num_shards, split_bytes=64)
        return self.pieces


async def test_two_shard_groups_split_a_tensor_by_rows(shared_groups) -> None:
    job = "two-groups"
    client = _SmallSplitClient([group_client(g.addresses) for g in shared_groups])
    emb = torch.arange(30, dtype=torch.float32).reshape(10, 3)
    bias = torch.tensor([1.0, 2.0, 3.0])
    async with stubs() as stub_for:
        try:
            await client.register_model(
                job, {"emb": emb, "bias": bias}, sgd(1.0), consistency("async"), num_slots=1
            )
            pieces = {(p.shard, p.piece_name) for p in client.pieces}
            assert {(0, "emb#rows=0:5"), (1, "emb#rows=5:10")} <= pieces
            for shard, group in enumerate(shared_groups):
                held = await assert_same_state(stub_for, group.replicas, job)
                names = {t.name for t in held.tensors}
                assert f"emb#rows={5 * shard}:{5 * shard + 5}" in names

            grad_emb = torch.zeros(10, 3)
            grad_emb[1, 2] = 1.0  # a row of group 0
            grad_emb[8, 0] = 4.0  # a row of group 1
            results = await client.push(job, 0, 0, 0, {"emb": grad_emb, "bias": torch.ones(3)})
            assert [(r.version, r.duplicate) for r in results] == [(1, False), (1, False)]
            versions, pulled = await client.pull(job)
            assert versions == [1, 1]
            assert torch.equal(pulled["emb"], emb - grad_emb)
            assert torch.equal(pulled["bias"], bias - 1.0)
            for group in shared_groups:
                assert (await assert_same_state(stub_for, group.replicas, job)).version == 1

            # a push that leaves out `bias` changes only the emb pieces
            results = await client.push(job, 1, 0, 1, {"emb": torch.ones(10, 3)})
            versions, delta = await client.pull(job, since_version=1)
            assert versions == [2, 2] and set(delta) == {"emb"}
            assert torch.equal(delta["emb"], emb - grad_emb - 1.0)
            for group in shared_groups:
                assert (await assert_same_state(stub_for, group.replicas, job)).version == 2
        finally:
            await client.close()
