"""SIGTERM: an idle replica exits at once with status 0; a push in flight still
finishes and is acknowledged, replicated, before the replica exits."""

from __future__ import annotations

import asyncio
import signal
import time

import grpc
import pytest
import torch

from stalwart.procs import start_service
from tests.helpers import assert_eventually
from tests.integration.paramserver.conftest import COMMON_FLAGS, MODULE, ROOT
from tests.integration.paramserver.support import (
    consistency,
    fingerprint,
    metric,
    model_header,
    push_messages,
    push_raw,
    register_raw,
    sgd,
    signal_group,
    stream_messages,
    stubs,
)

pytestmark = pytest.mark.timeout(240)

GRACE_S = 30  # what a replica would wait out if it waited for anything at shutdown


def test_idle_replica_exits_at_once_with_status_zero(launcher) -> None:
    # A fresh interpreter, as deployed (a preloaded fork never tears one down):
    # torch's teardown took 1-3 s (5-11 s on a busy machine) after "stopped".
    proc = start_service(MODULE, [*COMMON_FLAGS, "--grace-seconds", str(GRACE_S)],
                         launcher.run_dir, f"{launcher.prefix}-fresh", timeout=90,
                         cwd=ROOT, preload=False)  # fmt: skip
    launcher.procs.append(proc)
    started = time.monotonic()
    code = proc.terminate(timeout=GRACE_S)  # SIGKILL after that: -9
    took = time.monotonic() - started
    print(f"\nidle paramserver, SIGTERM to exit: {took:.2f}s")
    assert code == 0
    log_text = proc.log_path.read_text()
    steps = [
        '"signal received, shutting down"',
        '"stopped"',
        '"exiting without interpreter teardown"',
    ]
    positions = [log_text.find(step) for step in steps]
    assert -1 not in positions and positions == sorted(positions), positions
    assert "threads still running" not in log_text
    assert not proc.ready_file.exists()


async def test_push_in_flight_at_sigterm_is_finished_and_replicated(launcher) -> None:
    backup = launcher.start("b", "--role", "backup")
    primary = launcher.start("p", "--backups", backup.address, "--grace-seconds", str(GRACE_S))
    job = "shutdown-inflight"
    params = {"w": torch.arange(6, dtype=torch.float32)}
    header = model_header(job, params, sgd(0.5), consistency("async"), num_slots=1)
    async with stubs() as stub_for:
        await register_raw(stub_for(primary.address), header, params)
        # The backup cannot answer: the push waits in the primary for its commit.
        signal_group(backup, signal.SIGSTOP)
        try:
            before = metric(primary, "grpc_server_started_total", grpc_method="Push")
            grads = {"w": torch.ones(6)}
            push = asyncio.create_task(
                push_raw(stub_for(primary.address), push_messages(job, 0, 0, grads))
            )
            await asyncio.to_thread(
                assert_eventually,
                lambda: metric(primary, "grpc_server_started_total", grpc_method="Push") > before,
                timeout=GRACE_S,
            )
            await _sigterm(primary)  # shutdown begins with the push open
        finally:
            signal_group(backup, signal.SIGCONT)
        reply = await asyncio.wait_for(push, GRACE_S)
        assert reply.version == 1 and not reply.duplicate  # acknowledged ...
        held = await fingerprint(stub_for(backup.address), job)
        assert held.version == 1  # ... and held by the backup, as acknowledged work must be
    assert await asyncio.to_thread(primary.popen.wait, GRACE_S) == 0
    assert '"stopped"' in primary.log_path.read_text()


async def test_push_streams_end_at_sigterm_and_the_push_on_one_is_finished(launcher) -> None:
    """A PushStream waiting between pushes ends at once at SIGTERM; one with a push in
    flight ends once that push is acknowledged and replicated. Open, either would
    hold the replica's exit for its whole grace (set far longer than the test here)."""
    backup = launcher.start("b", "--role", "backup")
    primary = launcher.start("p", "--backups", backup.address, "--grace-seconds", "3600")
    job = "shutdown-streams"
    params = {"w": torch.arange(6, dtype=torch.float32)}
    header = model_header(job, params, sgd(0.5), consistency("async"), num_slots=2)
    async with stubs() as stub_for:
        stub = stub_for(primary.address)
        await register_raw(stub, header, params)
        idle, busy = stub.PushStream(), stub.PushStream()
        for message in stream_messages(push_messages(job, 0, 0, {"w": torch.ones(6)})):
            await idle.write(message)
        assert (await idle.read()).version == 1  # answered; the call stays open, idle
        signal_group(backup, signal.SIGSTOP)  # the next push waits for its commit
        try:
            started = _phase_count(primary, "receive")
            pushed = push_messages(job, 0, 1, {"w": torch.ones(6)}, base_version=1)
            for message in stream_messages(pushed):
                await busy.write(message)
            await asyncio.to_thread(
                assert_eventually, lambda: _phase_count(primary, "receive") > started,
                timeout=GRACE_S,
            )  # fmt: skip
            await _sigterm(primary)
        finally:
            signal_group(backup, signal.SIGCONT)
        with pytest.raises(grpc.RpcError) as ended:
            await asyncio.wait_for(idle.read(), GRACE_S)
        assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
        reply = await asyncio.wait_for(busy.read(), GRACE_S)
        assert reply.version == 2 and not reply.duplicate
        assert await busy.read() is grpc.aio.EOF  # then the call ends, OK
        held = await fingerprint(stub_for(backup.address), job)
        assert held.version == 2
    assert await asyncio.to_thread(primary.popen.wait, GRACE_S) == 0
    log_text = primary.log_path.read_text()
    assert '"stopped"' in log_text and "ran past the grace period" not in log_text


def _phase_count(proc, phase: str) -> float:
    return metric(proc, "stalwart_paramserver_push_phase_seconds_count", phase=phase)


async def _sigterm(proc) -> None:
    """SIGTERM, then wait until the process logged that its shutdown began."""
    proc.popen.send_signal(signal.SIGTERM)
    await asyncio.to_thread(
        assert_eventually,
        lambda: '"signal received, shutting down"' in proc.log_path.read_text(),
        timeout=GRACE_S,
    )
