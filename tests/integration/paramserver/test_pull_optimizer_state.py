"""Pull with optimizer_state: the optimizer's tensors of every shard group, from the same
version as the parameters, bitwise what torch's own optimizer holds after the same steps."""

from __future__ import annotations

import grpc
import pytest
import torch

from stalwart import optim
from stalwart.api import paramserver
from stalwart.client import ParamServerClient
from tests.integration.paramserver.support import (
    adam,
    consistency,
    expect_error,
    group_client,
    stubs,
)

pytestmark = pytest.mark.timeout(300)  # the first optimizer built here imports torch._dynamo


def initial() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return {"w": torch.randn(5, 4, generator=g), "b": torch.randn(4, generator=g),
            "v": torch.randn(3, generator=g)}  # fmt: skip


def grads(step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(50 + step)
    return {n: torch.randn(t.shape, generator=g) for n, t in initial().items()}


async def test_optimizer_state_of_both_groups_equals_torchs(shared_groups) -> None:
    job, spec = "pull-optimizer-state", adam(0.05)
    client = ParamServerClient([group_client(g.addresses) for g in shared_groups])
    try:
        await client.register_model(job, initial(), spec, consistency("sync"), 1)
        assert len({p.shard for p in client.pieces}) == 2  # the tensors sit in both groups
        for step in range(3):
            await client.push(job, step, 0, step, grads(step))

        own = {n: t.clone() for n, t in initial().items()}
        torch_opt = optim.build(spec, list(own.values()))
        for step in range(3):
            for name, p in own.items():
                p.grad = grads(step)[name]
            torch_opt.step()
        want = optim.export_state(torch_opt, {id(p): n for n, p in own.items()})

        versions, got = await client.pull(job, -1, 3, optimizer_state=True)
        assert versions == [3, 3]
        assert sorted(got) == sorted([*own, *want])
        for name, value in {**own, **want}.items():
            assert torch.equal(got[name], value), name
        _, plain = await client.pull(job, -1, 3)
        assert sorted(plain) == sorted(own)  # without the flag: parameters only
    finally:
        await client.close()


async def test_optimizer_state_needs_everything(shared_groups) -> None:
    job = "pull-optimizer-state-delta"
    client = ParamServerClient([group_client(shared_groups[0].addresses)])
    try:
        await client.register_model(job, initial(), adam(0.05), consistency("sync"), 1)
    finally:
        await client.close()
    async with stubs() as stub_for:
        stub = stub_for(shared_groups[0].primary.address)
        request = paramserver.PullRequest(job_id=job, since_version=0, epoch=1,
                                          optimizer_state=True)  # fmt: skip

        async def pull():
            async for _ in stub.Pull(request, timeout=30):
                pass

        err = await expect_error(pull(), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")
        assert "since_version -1" in err.message
