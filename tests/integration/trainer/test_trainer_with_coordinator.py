"""Trainers and a warm standby taking work from a real coordinator: a trainer is killed
at an exact step, the standby takes its slot, and the job still ends bitwise equal to
the fault-free reference run."""

from __future__ import annotations

import asyncio
import time

import pytest

from stalwart import training
from stalwart.api import common, coordinator, trainer, trainer_grpc
from stalwart.channel import open_channel
from stalwart.client import CoordinatorClient

from .support import (
    assert_bitwise_equal,
    coordinated_paramservers,
    final_weights,
    small_spec,
    wait_exit,
    wait_trainers,
)

pytestmark = pytest.mark.timeout(300)


async def wait_job_done(client: CoordinatorClient, job_id: str, timeout: float) -> coordinator.Job:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = await client.get_job(job_id)
        if job.state in (coordinator.JOB_STATE_SUCCEEDED, coordinator.JOB_STATE_FAILED):
            return job
        await asyncio.sleep(0.2)
    raise AssertionError(f"job {job_id} not finished after {timeout}s: {job}")


async def test_standby_takes_the_slot_of_a_killed_trainer_bitwise(cluster_procs):
    procs = cluster_procs
    spec = small_spec(steps=16)
    training.make_deterministic()
    want = await asyncio.to_thread(training.reference_run, spec)

    join, (primary, backup) = await coordinated_paramservers(procs)
    procs.trainer("tr0", *join)
    doomed = procs.trainer("tr1", *join, faults="crash_at_step=6")
    standby = procs.trainer("sb", *join, "--standby")

    async with CoordinatorClient(join[1]) as client:
        await wait_trainers(client, {"tr0", "tr1", "sb"}, 30)
        job = await client.create_job(spec, job_id="job-coord")
        done = await wait_job_done(client, job.job_id, 180)
        assert done.state == coordinator.JOB_STATE_SUCCEEDED, done.reason
        promoted = [
            e
            async for e in _events_until_end(client, job.job_id)
            if e.kind == common.EVENT_KIND_STANDBY_PROMOTED
        ]
    assert await asyncio.to_thread(wait_exit, doomed, 5) == -9
    assert "fault fired" in doomed.log_tail(200)
    assert [e.node_id for e in promoted] == ["sb"], promoted
    status = await trainer_status(standby.address)
    assert status.step == spec.steps - 1  # the standby computed the slot's last steps
    version, got = await final_weights([primary.address, backup.address], job.job_id, spec)
    assert version == spec.steps
    assert_bitwise_equal(got, want)


async def test_a_step_needs_no_call_of_its_own_and_stays_bitwise(cluster_procs):
    """The weights each step ends with come back in the answers to the pushes, and
    the pushes go over one open PushStream per trainer: over a fault-free job the
    primary serves a pull or two per trainer (its first weights) and a stream or two
    per trainer, not a call per step, and the job ends bitwise equal to the
    reference run."""
    from tests.integration.paramserver.support import metric

    procs = cluster_procs
    spec = small_spec(steps=30)
    training.make_deterministic()
    want = await asyncio.to_thread(training.reference_run, spec)
    from tests.integration.coordinator.support import wait_leader

    coord = procs.coordinator("c1")
    await wait_leader(coord.address)
    join = ("--coordinator", coord.address)
    metrics_on = ("--metrics-port", "0")  # after the launcher's -1: the last one counts
    backup = procs.start("services.paramserver", "ps-b", "--role", "backup", *join)
    primary = procs.start("services.paramserver", "ps-p", "--role", "primary",
                          "--backups", backup.address, *join, *metrics_on)  # fmt: skip
    procs.trainer("tr0", *join)
    procs.trainer("tr1", *join)
    async with CoordinatorClient(join[1]) as client:
        await wait_trainers(client, {"tr0", "tr1"}, 30)
        job = await client.create_job(spec, job_id="job-no-pull")
        done = await wait_job_done(client, job.job_id, 180)
        assert done.state == coordinator.JOB_STATE_SUCCEEDED, done.reason
    pulls = await asyncio.to_thread(
        metric, primary, "grpc_server_started_total", grpc_method="Pull"
    )
    calls = {
        method: await asyncio.to_thread(
            metric, primary, "grpc_server_started_total", grpc_method=method
        )
        for method in ("Push", "PushStream")
    }
    applied = await asyncio.to_thread(
        metric, primary, "stalwart_paramserver_pushes_total", result="applied"
    )
    assert applied >= 2 * spec.steps
    assert pulls <= 3 * 2, f"{pulls} pulls for {spec.steps} steps"
    assert calls["Push"] + calls["PushStream"] <= 3 * 2, f"{calls} for {spec.steps} steps"
    version, got = await final_weights([primary.address, backup.address], job.job_id, spec)
    assert version == spec.steps
    assert_bitwise_equal(got, want)


async def trainer_status(address: str) -> trainer.GetTrainerStatusResponse:
    async with open_channel(address) as channel:
        return await trainer_grpc.TrainerServiceStub(channel).GetTrainerStatus(
            trainer.GetTrainerStatusRequest(), timeout=5
        )


async def _events_until_end(client: CoordinatorClient, job_id: str):
    """Replay the job's events up to its SUCCEEDED state change."""
    async for event in client.watch_events(job_id=job_id):
        yield event
        if (
            event.kind == common.EVENT_KIND_JOB_STATE_CHANGED
            and "succeeded" in event.message.lower()
        ):
            return
