"""Bad input gets the right status code and ErrorInfo reason, is counted in metrics,
and changes nothing.

Each case registers its own small job on the shared group 0 and applies good
pushes first, so the state is not the initial one; then it sends the bad input
through raw stubs (hand-built streams) and checks that the version and the
combined fingerprint of primary and backup did not move.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc
import pytest
import torch

from stalwart import codec
from stalwart.api import common, paramserver
from tests.integration.paramserver.conftest import MAX_MESSAGE_BYTES, MAX_STREAM_BYTES
from tests.integration.paramserver.support import (
    Stub,
    assert_same_state,
    consistency,
    expect_error,
    fingerprint,
    metric,
    model_header,
    pull_raw,
    push_messages,
    push_raw,
    register_raw,
    rpc_errors,
    sgd,
    stubs,
)

pytestmark = pytest.mark.timeout(180)

Code = grpc.StatusCode
SLOTS = 2
LR = 0.5


def initial() -> dict[str, torch.Tensor]:
    return {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4), "b": torch.zeros(4)}


def good(scale: float = 1.0) -> dict[str, torch.Tensor]:
    return {"w": torch.full((3, 4), float(scale)), "b": torch.full((4,), float(scale))}


@dataclass
class Job:
    """A registered job with good pushes applied; ``next_step`` is slot 0's next step."""

    stub: Stub
    job_id: str
    mode: str
    next_step: int
    version: int


async def make_job(stub: Stub, job_id: str, mode: str) -> Job:
    modes = {
        "async": consistency("async"),
        "sync": consistency("sync"),
        "ssp": consistency("ssp", staleness=1, refuse=True),
    }
    await register_raw(
        stub, model_header(job_id, initial(), sgd(LR), modes[mode], SLOTS), initial()
    )
    if mode == "sync":  # step 0 from both slots: version 1
        await asyncio.gather(
            *(push_raw(stub, push_messages(job_id, 0, s, good(s + 1))) for s in range(SLOTS))
        )
        return Job(stub, job_id, mode, next_step=1, version=1)
    if mode == "ssp":  # slot 0 runs one step ahead of slot 1, the most the bound allows
        for step in range(2):
            await push_raw(stub, push_messages(job_id, step, 0, good()))
        return Job(stub, job_id, mode, next_step=2, version=2)
    await push_raw(stub, push_messages(job_id, 0, 0, good()))
    return Job(stub, job_id, mode, next_step=1, version=1)


def _push(job: Job, grads=None, **kw) -> list[paramserver.PushRequest]:
    kw.setdefault("step", job.next_step)
    kw.setdefault("slot", 0)
    kw.setdefault("base_version", job.version)
    step, slot = kw.pop("step"), kw.pop("slot")
    return push_messages(job.job_id, step, slot, good(2.0) if grads is None else grads, **kw)


def _bad_crc(job: Job):
    messages = _push(job)
    messages[1].chunk.crc32c ^= 0x1  # one bit of the first chunk's CRC
    return push_raw(job.stub, messages)


def _truncated(job: Job):
    messages = _push(job, chunk_bytes=16)  # w is 48 bytes: 3 chunks, then b
    return push_raw(job.stub, messages[:3])  # the header and 2 of w's 3 chunks


def _one_chunk_for_all(job: Job, packed: bool, extra: int = 0):
    """The whole gradient (w then b) in a single chunk, plus ``extra`` stray bytes."""
    messages = _push(job)
    messages[0].header.packed = packed
    data = b"".join(bytes(codec.byte_view(t)) for t in good(2.0).values()) + bytes(extra)
    chunk = common.TensorChunk(tensor_index=0, offset=0, data=data, crc32c=codec.crc32c(data))
    return push_raw(job.stub, [messages[0], paramserver.PushRequest(chunk=chunk)])


def _oversize_message(job: Job):
    messages = _push(job)
    data = bytes(MAX_MESSAGE_BYTES + 1024)  # one chunk message over the server's limit
    messages[1] = paramserver.PushRequest(
        chunk=common.TensorChunk(tensor_index=0, offset=0, data=data, crc32c=codec.crc32c(data))
    )
    return push_raw(job.stub, messages)


def _over_stream_limit(job: Job):
    elements = MAX_STREAM_BYTES // 4 + 1  # float32: one element over --max-stream-bytes
    header = model_header("too-big", {"huge": torch.empty(0)}, sgd(LR), consistency("async"), SLOTS)
    header.tensors[0].shape[:] = [elements]
    return register_raw(job.stub, header, {})  # refused at the header: no chunk needed


@dataclass(frozen=True)
class Case:
    code: grpc.StatusCode
    reason: str
    send: Callable[[Job], Awaitable]
    mode: str = "async"


CASES = {
    "unknown-job": Case(
        Code.NOT_FOUND,
        "UNKNOWN_JOB",
        lambda j: push_raw(j.stub, push_messages("no-such-job", 0, 0, good())),
    ),
    "wrong-shape": Case(
        Code.INVALID_ARGUMENT,
        "BAD_SHAPE",
        lambda j: push_raw(j.stub, _push(j, {"w": torch.ones(4, 3)})),
    ),
    "unknown-tensor": Case(
        Code.INVALID_ARGUMENT,
        "BAD_SHAPE",
        lambda j: push_raw(j.stub, _push(j, {"v": torch.ones(3, 4)})),
    ),
    "wrong-dtype": Case(
        Code.INVALID_ARGUMENT,
        "BAD_DTYPE",
        lambda j: push_raw(j.stub, _push(j, {"w": torch.ones(3, 4, dtype=torch.float64)})),
    ),
    "nan": Case(
        Code.INVALID_ARGUMENT,
        "NON_FINITE",
        lambda j: push_raw(
            j.stub, _push(j, {"w": torch.ones(3, 4), "b": torch.tensor([0, 1, float("nan"), 0])})
        ),
    ),
    "inf": Case(
        Code.INVALID_ARGUMENT,
        "NON_FINITE",
        lambda j: push_raw(j.stub, _push(j, {"w": torch.full((3, 4), -float("inf"))})),
    ),
    "chunk-runs-on-unpacked": Case(
        Code.INVALID_ARGUMENT, "BAD_SHAPE", lambda j: _one_chunk_for_all(j, packed=False)
    ),
    "packed-overrun": Case(
        Code.INVALID_ARGUMENT, "BAD_SHAPE", lambda j: _one_chunk_for_all(j, True, extra=4)
    ),
    "bad-crc": Case(Code.DATA_LOSS, "CHECKSUM_MISMATCH", _bad_crc),
    "truncated-stream": Case(Code.INVALID_ARGUMENT, "TRUNCATED_STREAM", _truncated),
    "over-max-message-size": Case(Code.RESOURCE_EXHAUSTED, "RESOURCE_EXHAUSTED", _oversize_message),
    "over-max-stream-bytes": Case(Code.RESOURCE_EXHAUSTED, "LIMIT_EXCEEDED", _over_stream_limit),
    "stale-epoch": Case(
        Code.FAILED_PRECONDITION, "STALE_EPOCH", lambda j: push_raw(j.stub, _push(j, epoch=0))
    ),
    "conflicting-push": Case(
        Code.ALREADY_EXISTS,
        "CONFLICTING_PUSH",
        lambda j: push_raw(j.stub, _push(j, step=0, base_version=0)),  # step 0 had good(1.0)
    ),
    "slot-out-of-range": Case(
        Code.INVALID_ARGUMENT, "INVALID_ARGUMENT", lambda j: push_raw(j.stub, _push(j, slot=SLOTS))
    ),
    "sync-wrong-base": Case(
        Code.ABORTED,
        "TOO_STALE",
        lambda j: push_raw(j.stub, _push(j, base_version=j.version - 1)),
        mode="sync",
    ),
    "ssp-over-bound": Case(
        Code.ABORTED, "TOO_STALE", lambda j: push_raw(j.stub, _push(j)), mode="ssp"
    ),
}


def _counters(primary, case: Case) -> dict[str, float]:
    """The counters this case must raise by one (and, for gRPC's own refusal, one it must not)."""
    if case.reason == "RESOURCE_EXHAUSTED":
        # Refused by gRPC itself: the handler never sees the message (no
        # ErrorInfo); the server counts the call as cut short, and
        # it must not pass for a truncated stream.
        return {
            "handled": metric(
                primary, "grpc_server_handled_total", grpc_method="Push", grpc_code="CANCELLED"
            ),
            "truncated": rpc_errors(primary, "TRUNCATED_STREAM"),
        }
    return {"reason": rpc_errors(primary, case.reason)}


@pytest.mark.parametrize("name", list(CASES))
async def test_bad_input_is_refused_counted_and_changes_nothing(shared_groups, name: str) -> None:
    case = CASES[name]
    group = shared_groups[0]
    async with stubs() as stub_for:
        job = await make_job(stub_for(group.primary.address), f"bad-{name}", case.mode)
        before = await assert_same_state(stub_for, group.replicas, job.job_id)
        assert before.version == job.version
        _, params_before = await pull_raw(job.stub, job.job_id)
        counted = _counters(group.primary, case)

        err = await expect_error(case.send(job), case.code, case.reason)
        assert err.message, "every refusal says why"

        expected = {k: v + (k != "truncated") for k, v in counted.items()}
        assert _counters(group.primary, case) == expected
        after = await assert_same_state(stub_for, group.replicas, job.job_id)
        assert (after.version, after.combined) == (before.version, before.combined)
        _, params_after = await pull_raw(job.stub, job.job_id)
        for name_, value in params_before.items():
            assert torch.equal(params_after[name_], value)
        for replica in group.replicas:  # nothing was created either
            for other in ("no-such-job", "too-big"):
                await expect_error(
                    fingerprint(stub_for(replica.address), other), Code.NOT_FOUND, "UNKNOWN_JOB"
                )


async def test_duplicate_push_is_acknowledged_and_applied_once(shared_groups) -> None:
    group = shared_groups[0]
    async with stubs() as stub_for:
        job = await make_job(stub_for(group.primary.address), "bad-duplicate", "async")
        first = await push_raw(job.stub, _push(job))  # step 1, good(2.0)
        assert (first.version, first.duplicate) == (2, False)
        state = await assert_same_state(stub_for, group.replicas, job.job_id)

        again = await push_raw(job.stub, _push(job))  # the very same bytes: a retry
        assert (again.version, again.duplicate) == (2, True)
        after = await assert_same_state(stub_for, group.replicas, job.job_id)
        assert (after.version, after.combined) == (state.version, state.combined)
        version, params = await pull_raw(job.stub, job.job_id)
        # good(1.0) at step 0 and good(2.0) at step 1, each once, at lr 0.5
        assert version == 2
        assert torch.equal(params["w"], initial()["w"] - LR * 1.0 - LR * 2.0)
        assert torch.equal(params["b"], torch.full((4,), -1.5))

        # the same key with other bytes is a conflict, not a second application
        await expect_error(
            push_raw(job.stub, _push(job, good(3.0))), Code.ALREADY_EXISTS, "CONFLICTING_PUSH"
        )
        final = await assert_same_state(stub_for, group.replicas, job.job_id)
        assert (final.version, final.combined) == (state.version, state.combined)


async def test_pushes_refused_at_their_header_arrive_with_the_status_sent(launcher) -> None:
    """A push for a job the replica does not hold is refused after its header, while
    the client still has 4 MiB chunks to write; each refusal must reach it as
    NOT_FOUND, not as the INTERNAL a grpc.aio client reports when a write fails after
    the status arrived (the server reads the rest of the stream before refusing)."""
    primary = launcher.start("p", "--role", "primary")  # default limits: 4 MiB chunks
    messages = push_messages("never-held", 0, 0, {"w": torch.ones(6 << 20)})  # 24 MiB
    async with stubs() as stub_for:
        stub = stub_for(primary.address)
        details = set()
        for _ in range(30):
            err = await expect_error(push_raw(stub, messages), Code.NOT_FOUND, "UNKNOWN_JOB")
            details.add(err.message)
        assert len(details) == 1 and "never-held" in details.pop()


@pytest.mark.parametrize("chunk_size", [1, 4095])
async def test_a_pull_in_tiny_chunks_is_refused_and_the_floor_is_served(
    shared_groups, chunk_size: int
) -> None:
    """Each chunk is a message of its own: chunk_size 1 made millions of them."""
    group = shared_groups[0]
    async with stubs() as stub_for:
        job = await make_job(stub_for(group.primary.address), f"tiny-pull-{chunk_size}", "async")
        err = await expect_error(
            pull_raw(job.stub, job.job_id, chunk_size=chunk_size),
            Code.INVALID_ARGUMENT, "INVALID_ARGUMENT",
        )  # fmt: skip
        assert "chunk_size" in err.message and str(chunk_size) in err.message
        _, whole = await pull_raw(job.stub, job.job_id)
        version, floor = await pull_raw(job.stub, job.job_id, chunk_size=4096)
        assert version == job.version
        assert floor.keys() == whole.keys()
        assert all(torch.equal(floor[name], whole[name]) for name in whole)
