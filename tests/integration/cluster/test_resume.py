"""Durable mode end to end: a job submitted from the CLI with a checkpoint interval on a
``file://`` store trains part-way, the whole cluster is stopped (what ``stalwart down``
does), a new one comes up on the same store (``stalwart up --store-url file://DIR``),
``stalwart job resume`` continues the job from its newest complete checkpoint, and
it ends bitwise equal to the uninterrupted reference run. Resuming an unknown job
or one without a checkpoint is one clear error line, exit 2."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from stalwart import cluster, training
from stalwart.api import common, coordinator
from stalwart.client import CoordinatorClient
from stalwart.procs import start_service
from tests.helpers import PRELOAD, assert_eventually_async
from tests.integration.trainer.support import assert_bitwise_equal, final_weights
from tests.integration.trainer.test_trainer_with_coordinator import (
    _events_until_end,
    wait_job_done,
)

from .test_cli import EXIT_INVALID_INPUT, ROOT, one_error_line, stalwart

pytestmark = [pytest.mark.integration, pytest.mark.timeout(2400)]

JOB = "durable"
STOP_AT = 10  # phase one's trainers stop making progress here


def config(store_url: str, runs: Path, trainers: int, env=None) -> cluster.ClusterConfig:
    return cluster.ClusterConfig(trainers=trainers, standbys=0, spares=0, store_url=store_url,
                                 runs_root=runs, preload_services=PRELOAD,
                                 trainer_env=env or {}, start_timeout_s=600)  # fmt: skip


async def run_part_way(store_url: str, runs: Path, gradients: str) -> coordinator.JobSpec:
    """Phase one: submit from the CLI, train to step STOP_AT and its checkpoint, stop
    everything. The trainers hang at STOP_AT, so the job cannot finish meanwhile. On a
    fast machine the job passes marks before a save completes, and its catch-up order
    is at STOP_AT + 1, which it never reaches: the leader then saves it where it
    stands (ckptplan.next_order, stalled), so the newest checkpoint is at STOP_AT
    whichever way the race goes."""
    hang = {"STALWART_FAULTS": f"hang_at_step={STOP_AT}"}
    first = cluster.start(config(store_url, runs, trainers=2, env=hang))
    try:
        await cluster.wait_healthy(first, 600)
        submit = stalwart("job", "submit", "--slots", "2", "--steps", "40", "--batch-size", "16",
                          "--arg", "width=8", "--seed", "7", "--checkpoint-interval", "2",
                          "--job-id", JOB, "--gradient-dtype", gradients, "-o", "json",
                          "--run-dir", str(first.run_dir), timeout=300)  # fmt: skip
        assert submit.returncode == 0, submit.stderr
        async with CoordinatorClient(first.coordinator_addresses, retry_for_s=120) as client:

            async def checkpointed():
                job = await client.get_job(JOB)
                listing = await client.list_checkpoints(JOB)
                newest = listing.checkpoints[0].step if listing.checkpoints else -1
                assert job.step == STOP_AT and newest == STOP_AT, (job.step, newest)
                return job

            job = await assert_eventually_async(checkpointed, timeout=300, interval=0.2)
        assert job.spec.checkpoint_interval == 2
        return job.spec
    finally:
        cluster.stop_run(first.run_dir, 15)  # `stalwart down`


@pytest.mark.parametrize("gradients", ["float32", "bfloat16"])
def test_down_up_resume_bitwise(tmp_path: Path, gradients: str):
    """bfloat16: the restored replicas expect the pushes in the dtype the job's trainers
    send (the checkpoint's manifest carries JobSpec.gradient_dtype)."""
    asyncio.run(_down_up_resume(tmp_path, gradients))


async def _down_up_resume(tmp_path: Path, gradients: str) -> None:
    store = tmp_path / "store"
    store.mkdir()
    url, runs = f"file://{store}", tmp_path / "runs"
    spec = await run_part_way(url, runs, gradients)
    wire = common.DTYPE_BFLOAT16 if gradients == "bfloat16" else common.DTYPE_UNSPECIFIED
    assert spec.gradient_dtype == wire
    training.make_deterministic()
    want = await asyncio.to_thread(training.reference_run, spec)

    # Phase two, on the same store; no trainers yet, so nothing trains before the resume.
    second = cluster.start(config(url, runs, trainers=0))
    late = []
    try:
        await cluster.wait_healthy(second, 600)
        # --timeout: how long to look for a leader (elections are slow on a loaded machine)
        target = ("--run-dir", str(second.run_dir), "--timeout", "120")
        unknown = stalwart("job", "resume", "no-such-job", *target, timeout=300)
        assert unknown.returncode == EXIT_INVALID_INPUT
        assert "no job 'no-such-job'" in one_error_line(unknown)

        resumed = stalwart("job", "resume", JOB, "-o", "json", *target, timeout=300)
        assert resumed.returncode == 0, resumed.stderr
        answer = json.loads(resumed.stdout)
        # retry_for_s: leader elections on a loaded machine's file:// store can take a while
        async with CoordinatorClient(second.coordinator_addresses, retry_for_s=120) as client:
            newest = (await client.list_checkpoints(JOB)).checkpoints[0]
            assert (answer["checkpoint"], answer["step"]) == (newest.checkpoint_id, newest.step)
            assert 0 < newest.step <= STOP_AT

            await client.create_job(coordinator.JobSpec(**_bare(spec)), job_id="bare")
            bare = stalwart("job", "resume", "bare", *target, timeout=300)
            assert bare.returncode == EXIT_INVALID_INPUT
            assert "has no complete checkpoint" in one_error_line(bare)
            await client.cancel_job("bare", "test over")

            joining = ",".join(second.coordinator_addresses)
            for name in ("late-0", "late-1"):
                late.append(start_service(
                    "services.trainer", ["--coordinator", joining, "--node-id", name,
                                         "--metrics-port", "-1"],
                    second.log_dir, name, cwd=ROOT, timeout=300, preload=PRELOAD,
                ))  # fmt: skip
            done = await wait_job_done(client, JOB, 600)
            assert done.state == coordinator.JOB_STATE_SUCCEEDED, done.reason
            restored = [e async for e in _events_until_end(client, JOB)
                        if e.kind == common.EVENT_KIND_CHECKPOINT_RESTORED]  # fmt: skip
        assert any("restore requested" in e.message and newest.checkpoint_id in e.message
                   for e in restored), [e.message for e in restored]  # fmt: skip
        version, got = await final_weights(second.paramserver_addresses(0), JOB, spec)
        assert version == spec.steps
        assert_bitwise_equal(got, want)
    finally:
        for proc in late:
            proc.terminate(timeout=10)
        cluster.stop_run(second.run_dir, 15)


def _bare(spec: coordinator.JobSpec) -> dict:
    """The same model with no checkpoint interval (and one slot)."""
    return {"model": spec.model, "model_args": dict(spec.model_args), "num_slots": 1,
            "steps": 5, "batch_size": spec.batch_size, "optimizer": spec.optimizer}  # fmt: skip
