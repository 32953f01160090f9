"""PushStream, pushes one after another on one open call, through a real primary +
backup: answered in order with what Push answers; a push of several chunks ends
where its specs say, so the next header follows its last chunk; a refused push ends
the call with Push's status and the pushes answered before it stand; the SDK sends
a client's pushes over one call and retries a refused one as a Push call."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import grpc
import pytest
import torch

from stalwart.api import paramserver
from stalwart.errors import RpcError
from tests.integration.paramserver.support import (
    TIMEOUT_S,
    Stub,
    assert_same_state,
    consistency,
    group_client,
    metric,
    model_header,
    pull_raw,
    push_messages,
    push_raw,
    register_raw,
    sgd,
    stream_messages,
    stubs,
)

pytestmark = pytest.mark.timeout(180)

Code = grpc.StatusCode
CHUNK = 16  # bytes: w (48 bytes) goes in three chunks, b (16) in one


def _initial() -> dict[str, torch.Tensor]:
    return {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4), "b": torch.zeros(4)}


def _grads(step: int) -> dict[str, torch.Tensor]:
    return {"w": torch.full((3, 4), 0.5 + step), "b": torch.arange(4.0) - step}


async def _register(stub: Stub, job_id: str) -> None:
    header = model_header(job_id, _initial(), sgd(0.25), consistency("async"), num_slots=1)
    await register_raw(stub, header, _initial())


def _push(job_id: str, step: int, **kw) -> list[paramserver.PushRequest]:
    kw.setdefault("base_version", step)
    grads = kw.pop("grads", None) or _grads(step)
    return push_messages(job_id, step, 0, grads, chunk_bytes=CHUNK, **kw)


async def _stream(
    stub: Stub, pushes: Sequence[Sequence[paramserver.PushRequest]], half_close: bool = True
) -> tuple[list[paramserver.PushStreamResponse], RpcError | None]:
    """Each push on one PushStream call, its answer read before the next is sent:
    the answers, and the error that ended the call (None when it ended OK)."""
    call = stub.PushStream(timeout=TIMEOUT_S)
    answers: list[paramserver.PushStreamResponse] = []
    try:
        for messages in pushes:
            try:
                for message in stream_messages(messages):
                    await call.write(message)
            except asyncio.InvalidStateError:
                pass  # refused at the header: the call ended with its status, read below
            answers.append(await call.read())
        if half_close:
            await call.done_writing()
            assert await call.read() is grpc.aio.EOF
    except grpc.RpcError as exc:
        return answers, RpcError.from_grpc(exc)
    return answers, None


async def test_pushes_on_one_call_get_push_answers_in_order(shared_groups) -> None:
    group = shared_groups[0]
    async with stubs() as stub_for:
        stub = stub_for(group.primary.address)
        for job in ("stream-a", "stream-b"):
            await _register(stub, job)
        # the same pushes, a duplicate of the last at the end: on one call, and as calls
        sent = [0, 1, 2, 3, 3]
        answers, err = await _stream(stub, [_push("stream-a", s) for s in sent])
        assert err is None
        by_calls = [await push_raw(stub, _push("stream-b", s)) for s in sent]
        assert [(a.version, a.duplicate) for a in answers] == [
            (1, False), (2, False), (3, False), (4, False), (4, True)
        ]  # fmt: skip
        assert [a.SerializeToString() for a in answers] == [b.SerializeToString() for b in by_calls]
        state = await assert_same_state(stub_for, group.replicas, "stream-a")
        assert state.version == 4
        _, on_stream = await pull_raw(stub, "stream-a")
        _, on_calls = await pull_raw(stub, "stream-b")
        for name, tensor in on_calls.items():
            assert torch.equal(on_stream[name], tensor), name


BAD = {
    "conflicting-push": (Code.ALREADY_EXISTS, "CONFLICTING_PUSH",
                         lambda job: _push(job, 0, grads=_grads(9))),
    "stale-epoch": (Code.FAILED_PRECONDITION, "STALE_EPOCH", lambda job: _push(job, 1, epoch=0)),
    "non-finite": (Code.INVALID_ARGUMENT, "NON_FINITE", lambda job: _push(
        job, 1, grads={"w": torch.full((3, 4), float("nan")), "b": torch.zeros(4)})),
    "unknown-job": (Code.NOT_FOUND, "UNKNOWN_JOB", lambda job: _push("no-such-job", 1)),
}  # fmt: skip


@pytest.mark.parametrize("name", list(BAD))
async def test_a_refused_push_ends_the_call_and_the_ones_before_stand(
    shared_groups, name: str
) -> None:
    code, reason, bad = BAD[name]
    group = shared_groups[0]
    job = f"stream-bad-{name}"
    async with stubs() as stub_for:
        stub = stub_for(group.primary.address)
        await _register(stub, job)
        before = await assert_same_state(stub_for, group.replicas, job)
        answers, err = await _stream(stub, [_push(job, 0), bad(job)])
        assert [(a.version, a.duplicate) for a in answers] == [(1, False)]
        assert err is not None and (err.code, err.reason) == (code, reason), repr(err)
        after = await assert_same_state(stub_for, group.replicas, job)
        assert after.version == before.version + 1  # the first push, nothing of the second


async def test_truncated_push_on_the_call_is_refused_as_truncated(shared_groups) -> None:
    """The half-close after part of a push: the call ends TRUNCATED_STREAM."""
    group = shared_groups[0]
    job = "stream-cut"
    async with stubs() as stub_for:
        stub = stub_for(group.primary.address)
        await _register(stub, job)
        call = stub.PushStream(timeout=TIMEOUT_S)
        for message in stream_messages(_push(job, 0)[:3]):  # the header, 2 of w's 3 chunks
            await call.write(message)
        await call.done_writing()
        with pytest.raises(grpc.RpcError) as info:
            await call.read()
        err = RpcError.from_grpc(info.value)
        assert (err.code, err.reason) == (Code.INVALID_ARGUMENT, "TRUNCATED_STREAM")
        assert (await assert_same_state(stub_for, group.replicas, job)).version == 0


def _calls(proc, method: str) -> float:
    return metric(proc, "grpc_server_started_total", grpc_method=method)


async def test_the_client_pushes_over_one_call_and_retries_a_refusal_as_a_push(
    shared_groups,
) -> None:
    group = shared_groups[0]
    job = "stream-client"
    client = group_client(group.addresses)
    try:
        await client.register_model(
            model_header(job, _initial(), sgd(0.25), consistency("async"), num_slots=1),
            list(_initial().values()),
        )
        streams, pushes = _calls(group.primary, "PushStream"), _calls(group.primary, "Push")
        for step in range(5):
            result = await client.push(job, step, 0, step, _grads(step))
            assert (result.version, result.duplicate) == (step + 1, False)
        assert _calls(group.primary, "PushStream") == streams + 1
        assert _calls(group.primary, "Push") == pushes

        # same key, other bytes: refused on the call, then as a Push call, which answers
        with pytest.raises(RpcError) as info:
            await client.push(job, 2, 0, 2, _grads(7))
        assert (info.value.code, info.value.reason) == (Code.ALREADY_EXISTS, "CONFLICTING_PUSH")
        assert _calls(group.primary, "Push") == pushes + 1
        # the next push opens a new call
        result = await client.push(job, 5, 0, 5, _grads(5))
        assert (result.version, result.duplicate) == (6, False)
        assert _calls(group.primary, "PushStream") == streams + 2
        assert _calls(group.primary, "Push") == pushes + 1
    finally:
        await client.close()
