"""Sync mode through real replicas ends bitwise equal to plain torch.optim.

A small Linear-ReLU-Linear model, three slots, each with its own batch of a
fixed dataset per step. Each step the slots pull the parameters, compute their
gradients and push them concurrently; the reference sums the same gradients in
slot order (``g0.clone() += g1 += g2``) and steps ``torch.optim`` itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest
import torch
from torch import nn
from torch.func import functional_call

from stalwart.api import common
from stalwart.client import ParamServerClient
from tests.integration.paramserver.support import (
    adam,
    assert_same_state,
    consistency,
    group_client,
    sgd,
    stubs,
)

pytestmark = pytest.mark.timeout(180)

SLOTS = 3
STEPS = 5
BATCH = 8

MODEL = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
_data = torch.Generator().manual_seed(1234)
INPUTS = torch.randn(64, 4, generator=_data)
TARGETS = torch.randn(64, 2, generator=_data)


def initial_params() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return {name: torch.randn(p.shape, generator=g) * 0.5 for name, p in MODEL.named_parameters()}


def slot_grads(params: Mapping[str, torch.Tensor], step: int, slot: int) -> dict[str, torch.Tensor]:
    """The gradient of one slot's batch at one step: rows drawn by a (step, slot) seed."""
    rows = torch.randperm(len(INPUTS), generator=torch.Generator().manual_seed(100 * step + slot))
    x, y = INPUTS[rows[:BATCH]], TARGETS[rows[:BATCH]]
    leaves = {n: p.detach().clone().requires_grad_(True) for n, p in params.items()}
    loss = nn.functional.mse_loss(functional_call(MODEL, leaves, (x,)), y)
    grads = torch.autograd.grad(loss, list(leaves.values()))
    return dict(zip(leaves, grads, strict=True))


def reference(make_optimizer: Callable[[list[torch.Tensor]], torch.optim.Optimizer]):
    """Parameters after each step, in plain torch."""
    params = {n: p.clone() for n, p in initial_params().items()}
    optimizer = make_optimizer(list(params.values()))
    history = []
    for step in range(STEPS):
        grads = [slot_grads(params, step, slot) for slot in range(SLOTS)]
        for name, p in params.items():
            total = grads[0][name].clone()
            for g in grads[1:]:
                total += g[name]
            p.grad = total
        optimizer.step()
        history.append({n: p.detach().clone() for n, p in params.items()})
    return history


CASES = {
    "sgd-momentum": (
        sgd(0.05, momentum=0.9),
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, foreach=False),
    ),
    "adam": (adam(0.01), lambda ps: torch.optim.Adam(ps, lr=0.01, foreach=False)),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_sync_steps_match_torch_bitwise(shared_groups, case: str) -> None:
    spec, make_optimizer = CASES[case]
    expected = reference(make_optimizer)
    group = shared_groups[0]
    job = f"sync-{case}"
    client = ParamServerClient([group_client(group.addresses)])
    async with stubs() as stub_for:
        try:
            await client.register_model(
                job, initial_params(), spec, consistency("sync"), num_slots=SLOTS
            )
            for step in range(STEPS):
                versions, params = await client.pull(job)
                assert versions == [step]
                results = await asyncio.gather(
                    *(
                        client.push(job, step, slot, step, slot_grads(params, step, slot))
                        for slot in range(SLOTS)
                    )
                )
                # every slot's push is answered once the step is applied, with its version
                assert [r[0].version for r in results] == [step + 1] * SLOTS
                versions, params = await client.pull(job, min_version=step + 1)
                assert versions == [step + 1]
                for name, want in expected[step].items():
                    assert torch.equal(params[name], want), f"{name} differs after step {step}"
                state = await assert_same_state(stub_for, group.replicas, job)
                assert state.version == step + 1
            kinds = {t.kind for t in state.tensors}
            assert kinds == ({"param", "momentum_buffer"} if spec.kind == common.OPTIMIZER_KIND_SGD
                             else {"param", "step", "exp_avg", "exp_avg_sq"})  # fmt: skip
        finally:
            await client.close()


# --- a model smaller than its shard groups --------------------------------------------

# One weight, and a buffer that goes to the other group on its own (the shard map puts
# whole small tensors on the least-loaded group): that group holds nothing the
# optimizer steps, and with no buffer, nothing at all. Such a group used to refuse the
# model with INTERNAL (torch.optim refuses an empty parameter list).
SMALL_CASES = {"group-with-nothing": False, "group-with-only-a-buffer": True}


def _linear_grad(weight: torch.Tensor, step: int, slot: int) -> torch.Tensor:
    rows = torch.randperm(len(INPUTS), generator=torch.Generator().manual_seed(100 * step + slot))
    x, y = INPUTS[rows[:BATCH]], TARGETS[rows[:BATCH]]
    leaf = weight.detach().clone().requires_grad_(True)
    loss = nn.functional.mse_loss(x @ leaf, y)
    (grad,) = torch.autograd.grad(loss, [leaf])
    return grad


@pytest.mark.parametrize("case", list(SMALL_CASES))
async def test_a_model_with_fewer_tensors_than_shard_groups(shared_groups, case: str) -> None:
    with_buffer = SMALL_CASES[case]
    initial = {"weight": torch.randn(4, 2, generator=torch.Generator().manual_seed(3))}
    if with_buffer:
        initial["seen"] = torch.zeros(1)
    want = initial["weight"].clone()
    optimizer = torch.optim.SGD([want], lr=0.05, momentum=0.9, foreach=False)
    client = ParamServerClient([group_client(g.addresses) for g in shared_groups])
    job = f"small-{case}"
    try:
        await client.register_model(job, initial, sgd(0.05, momentum=0.9), consistency("sync"),
                                    num_slots=SLOTS, buffers=("seen",) if with_buffer else ())  # fmt: skip
        owners = {p.tensor_name for p in client.pieces if p.shard == 1}
        assert owners == ({"seen"} if with_buffer else set())  # the case this test is about
        for step in range(STEPS):
            versions, params = await client.pull(job)
            assert versions == [step, step]
            pushes = []
            for slot in range(SLOTS):
                grads = {"weight": _linear_grad(params["weight"], step, slot)}
                if with_buffer:
                    grads["seen"] = torch.full((1,), float(step + 1))
                pushes.append(grads)
            await asyncio.gather(*(client.push(job, step, slot, step, pushes[slot])
                                   for slot in range(SLOTS)))  # fmt: skip
            want.grad = pushes[0]["weight"].clone()
            for grads in pushes[1:]:
                want.grad += grads["weight"]
            optimizer.step()
            versions, params = await client.pull(job, min_version=step + 1)
            assert versions == [step + 1, step + 1]
            assert torch.equal(params["weight"], want), f"weight differs after step {step}"
            if with_buffer:
                assert params["seen"].tolist() == [float(step + 1)]
    finally:
        await client.close()
