"""A push's answer carrying the next parameters (PushHeader.answer_parameters_bytes),
through a real primary + backup: the same tensors a pull of that version gives, for
every slot of a synchronous step and for a retried push, none when they do not fit,
and across two shard groups."""

from __future__ import annotations

import asyncio

import pytest
import torch

from stalwart import codec
from stalwart.client import ParamServerClient
from tests.integration.paramserver.support import (
    assert_same_state,
    consistency,
    group_client,
    metric,
    model_header,
    push_messages,
    push_raw,
    sgd,
    stubs,
)

pytestmark = pytest.mark.timeout(180)


def _initial() -> dict[str, torch.Tensor]:
    return {"w": torch.linspace(-1.0, 1.0, 12).reshape(3, 4), "b": torch.ones(4)}


def _assert_same(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name


def _answers_timed(proc) -> float:
    return metric(proc, "stalwart_paramserver_push_phase_seconds_count", phase="answer")


async def test_every_slot_of_a_sync_step_gets_the_committed_parameters(shared_groups) -> None:
    group = shared_groups[0]
    job = "answer-sync"
    client = group_client(group.addresses)
    init = _initial()
    header = model_header(job, init, sgd(0.25, momentum=0.9), consistency("sync"), num_slots=2)
    async with stubs() as stub_for:
        try:
            await client.register_model(header, list(init.values()))
            pulls = metric(group.primary, "grpc_server_started_total", grpc_method="Pull")
            answered = _answers_timed(group.primary)
            grads = [{"w": torch.full((3, 4), 0.5), "b": torch.arange(4.0)},
                     {"w": torch.full((3, 4), -0.125), "b": torch.ones(4)}]  # fmt: skip
            answers = await asyncio.gather(
                *(client.push(job, 0, s, 0, grads[s], answer_parameters=True) for s in (0, 1))
            )
            assert [(a.version, a.duplicate) for a in answers] == [(1, False), (1, False)]
            # no pull was made for them
            assert metric(group.primary, "grpc_server_started_total", grpc_method="Pull") == pulls
            version, pulled = await client.pull(job)
            assert version == 1
            for answer in answers:
                assert answer.parameters[0] == 1
                _assert_same(answer.parameters[1], pulled)
            assert (await assert_same_state(stub_for, group.replicas, job)).version == 1

            # a retried push (its answer lost) is a duplicate and carries the version too
            again = await client.push(job, 0, 0, 0, grads[0], answer_parameters=True)
            assert (again.version, again.duplicate) == (1, True)
            _assert_same(again.parameters[1], pulled)
            # not asked: none
            plain = await client.push(job, 0, 1, 0, grads[1])
            assert plain.duplicate and plain.parameters is None
            # the step timeline's answer phase: one per push that asked (3), not the plain one
            assert _answers_timed(group.primary) == answered + 3
        finally:
            await client.close()


async def test_an_answer_carries_only_what_fits_and_what_changed(shared_groups) -> None:
    group = shared_groups[0]
    job = "answer-limits"
    client = group_client(group.addresses)
    init = _initial()
    header = model_header(job, init, sgd(0.5), consistency("async"), num_slots=1)
    async with stubs() as stub_for:
        try:
            await client.register_model(header, list(init.values()))
            # a gradient of b alone: only b changed since the push's base version
            only_b = await client.push(job, 0, 0, 0, {"b": torch.ones(4)}, answer_parameters=True)
            assert only_b.version == 1 and sorted(only_b.parameters[1]) == ["b"]
            assert torch.equal(only_b.parameters[1]["b"], torch.full((4,), 0.5))

            # the caller takes fewer bytes than the parameters need: the answer has none
            messages = push_messages(job, 1, 0, {"w": torch.ones(3, 4)}, base_version=0)
            messages[0].header.answer_parameters_bytes = 16
            answer = await push_raw(stub_for(group.primary.address), messages)
            assert answer.version == 2 and not answer.parameters

            # ... and with room, a raw answer is a header and packed chunks, as a pull's
            messages = push_messages(job, 2, 0, {"w": torch.ones(3, 4)}, base_version=2)
            messages[0].header.answer_parameters_bytes = 1 << 20
            answer = await push_raw(stub_for(group.primary.address), messages)
            head = answer.parameters[0].header
            assert (answer.version, head.version, head.packed) == (3, 3, True)
            assembler = codec.ChunkAssembler(head.tensors, packed=True)
            for message in answer.parameters[1:]:
                assembler.add(message.chunk)
            assert torch.equal(assembler.finish()["w"], init["w"] - 1.0)
        finally:
            await client.close()


async def test_parameters_larger_than_the_servers_chunk_are_pulled(shared_groups) -> None:
    group = shared_groups[0]  # chunk size 128 KiB (SHARED_FLAGS)
    job = "answer-too-large"
    client = group_client(group.addresses)
    init = {"big": torch.zeros(200 * 1024 // 4)}  # 200 KiB: over the server's chunk size
    header = model_header(job, init, sgd(1.0), consistency("async"), num_slots=1)
    try:
        await client.register_model(header, list(init.values()))
        answer = await client.push(job, 0, 0, 0, {"big": torch.ones(51200)}, answer_parameters=True)
        assert answer.version == 1 and answer.parameters is None
    finally:
        await client.close()


async def test_two_shard_groups_answer_their_own_parts(shared_groups) -> None:
    job = "answer-two-groups"
    client = ParamServerClient([group_client(g.addresses) for g in shared_groups])
    params = {f"t{i}": torch.full((8,), float(i)) for i in range(6)}
    try:
        await client.register_model(job, params, sgd(1.0), consistency("async"), num_slots=1)
        assert {p.shard for p in client.pieces} == {0, 1}
        assert client.answers_carry_parameters
        grads = {name: torch.ones(8) for name in params}
        answers = await client.push(job, 0, 0, 0, grads, answer_parameters=True)
        versions, carried = client.carried(answers)
        pulled_versions, pulled = await client.pull(job)
        assert versions == pulled_versions == [1, 1]
        _assert_same(carried, pulled)
        # one group's answer without its part: nothing is taken from the others
        partial = [answers[0], type(answers[1])(answers[1].version, False)]
        assert client.carried(partial) is None
    finally:
        await client.close()
