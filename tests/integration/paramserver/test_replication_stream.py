"""The replication stream (services/paramserver/replstream.py): once open it carries
every forwarded push and commit, the result is bitwise what the unary calls give,
a backup that stops answering on it drops out of sync and is caught up as with
the unary calls, and a deposed primary applies nothing through it."""

from __future__ import annotations

import asyncio
import signal

import grpc
import pytest
import torch

from stalwart import limits
from stalwart.api import common, paramserver
from stalwart.errors import ErrorKind, RpcError
from tests.helpers import assert_eventually_async
from tests.integration.paramserver.support import (
    assert_same_state,
    configure_backup,
    consistency,
    expect_error,
    fingerprint,
    metric,
    model_header,
    promote,
    push_messages,
    push_raw,
    register_raw,
    sgd,
    signal_group,
    status,
    stubs,
)

pytestmark = pytest.mark.timeout(300)

SLOTS = 3
STEPS = 6
DEPOSED = {"FENCED", "STALE_EPOCH"}


def initial() -> dict[str, torch.Tensor]:
    return {"w": torch.linspace(-1.0, 1.0, 24).reshape(4, 6), "b": torch.zeros(6)}


def grads(step: int, slot: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(step * SLOTS + slot)
    return {"w": torch.randn(4, 6, generator=gen), "b": torch.randn(6, generator=gen)}


async def _streaming(stub, backup: str) -> bool:
    st = await status(stub)
    return any(b.address == backup and b.streaming and b.in_sync for b in st.backups)


def _calls(proc, method: str) -> float:
    return metric(proc, "grpc_server_started_total", grpc_method=method)


async def test_steps_go_on_one_stream_and_end_bitwise_equal_to_unary_calls(launcher) -> None:
    backups = launcher.start_many({"b1": ["--role", "backup"], "b2": ["--role", "backup"]})
    b1, b2 = backups["b1"], backups["b2"]
    primaries = launcher.start_many({
        "a1": ["--backups", b1.address],
        "a2": ["--backups", b2.address, "--unary-replication"],
    })  # fmt: skip
    a1, a2 = primaries["a1"], primaries["a2"]
    job = "stream-vs-unary"
    header = model_header(job, initial(), sgd(0.1, momentum=0.9), consistency("sync"), SLOTS)

    async with stubs() as stub_for:

        async def step(primary, k: int) -> None:
            replies = await asyncio.gather(*(
                push_raw(stub_for(primary.address), push_messages(job, k, s, grads(k, s), k))
                for s in range(SLOTS)
            ))  # fmt: skip
            assert {r.version for r in replies} == {k + 1}

        for primary in (a1, a2):
            await register_raw(stub_for(primary.address), header, initial())
            await step(primary, 0)
        # the first step opened the stream (it went as unary calls meanwhile)
        await assert_eventually_async(lambda: _streaming(stub_for(a1.address), b1.address))
        before = {m: _calls(b1, m) for m in ("ReplicatePush", "ReplicateCommit", "ReplicateStream")}
        for k in range(1, STEPS):
            await asyncio.gather(step(a1, k), step(a2, k))
        after = {m: _calls(b1, m) for m in before}
        assert after == before, "steps on an open stream make no call of their own"
        assert after["ReplicateStream"] == 1
        assert _calls(b2, "ReplicateStream") == 0 and _calls(b2, "ReplicateCommit") >= STEPS
        # a synchronous step reaches the backup as one forward, the sum of its pushes
        assert _calls(b2, "ReplicatePush") == _calls(b2, "ReplicateCommit") == STEPS
        assert not await _streaming(stub_for(a2.address), b2.address)

        streamed = await assert_same_state(stub_for, [a1, b1], job)
        unary = await assert_same_state(stub_for, [a2, b2], job)
        assert streamed.version == unary.version == STEPS
        assert streamed.combined == unary.combined  # bitwise the same update


async def test_a_backup_that_stops_answering_drops_out_then_fences_a_deposed_primary(
    launcher,
) -> None:
    b = launcher.start("b", "--role", "backup")
    a = launcher.start("a", "--backups", b.address, "--min-insync", "0",
                       "--backup-ack-seconds", "1")  # fmt: skip
    job = "stream-faults"
    header = model_header(job, initial(), sgd(0.5), consistency("async"), num_slots=1)

    async with stubs() as stub_for:
        stub = stub_for(a.address)

        async def push(k: int, epoch: int = 1):
            return await push_raw(stub, push_messages(job, k, 0, grads(k, 0), k, epoch=epoch))

        await register_raw(stub, header, initial())
        assert (await push(0)).version == 1
        await assert_eventually_async(lambda: _streaming(stub, b.address))

        # a frozen backup takes the pushed bytes into its socket buffer but never
        # answers: the push is acknowledged without it once the ack timeout ran out
        signal_group(b, signal.SIGSTOP)
        try:
            assert (await push(1)).version == 2
            st = await status(stub)
            assert [(x.in_sync, x.streaming) for x in st.backups] == [(False, False)]
            assert st.backups[0].last_error
        finally:
            signal_group(b, signal.SIGCONT)

        # caught up by the resync loop (InstallState), then the stream reopens
        async def in_sync() -> bool:
            return all(x.in_sync for x in (await status(stub)).backups)

        await assert_eventually_async(in_sync, timeout=60)
        k = 2

        async def streaming_again() -> bool:
            nonlocal k
            assert (await push(k)).version == k + 1
            k += 1
            return await _streaming(stub, b.address)

        await assert_eventually_async(streaming_again, timeout=60, interval=0.2)
        assert (await push(k)).version == k + 1
        k += 1
        settled = await assert_same_state(stub_for, [a, b], job)
        assert settled.version == k

        # --- the backup is promoted behind the primary's back; the primary's
        # stream to it stays open, and every message on it is checked ---
        assert await _streaming(stub, b.address)
        assert (await promote(stub_for(b.address), epoch=2)).epoch == 2
        await expect_error(push(k), grpc.StatusCode.FAILED_PRECONDITION, DEPOSED)
        for replica in (a, b):  # nothing applied anywhere
            now = await fingerprint(stub_for(replica.address), job)
            assert (now.version, now.combined) == (settled.version, settled.combined)
        assert (await status(stub)).role == common.REPLICA_ROLE_FENCED


async def test_a_backup_serves_at_most_max_replication_streams(launcher) -> None:
    backup = launcher.start_many({"b": ["--role", "backup"]})["b"]
    opening = paramserver.ReplicateStreamRequest(open=paramserver.ReplicateStreamOpen(epoch=1))
    async with stubs() as stub_for:
        stub = stub_for(backup.address)
        await configure_backup(stub, 1)  # as a promotion does: streams of epoch 1 are its primary's

        async def opened():
            call = stub.ReplicateStream(timeout=120)
            await call.write(opening)
            answer = await call.read()  # written once the session is counted
            assert answer.WhichOneof("result") == "opened"
            return call

        held = [await opened() for _ in range(limits.MAX_REPLICATION_STREAMS)]
        extra = stub.ReplicateStream(timeout=120)  # nothing written: refused at once
        with pytest.raises(grpc.RpcError) as info:
            await extra.read()
        err = RpcError.from_grpc(info.value)
        assert err.kind is ErrorKind.LIMIT_EXCEEDED and "replication streams" in err.message
        assert all(not call.done() for call in held)  # the open ones are untouched
        held.pop().cancel()

        async def room_again():
            held.append(await opened())

        await assert_eventually_async(room_again, timeout=30, interval=0.1)
        for call in held:
            call.cancel()
