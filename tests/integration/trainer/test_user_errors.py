"""Bugs in the user's task, with real trainers, paramservers and a coordinator: the
trainers stay up and report them, and the job fails with the error as its reason,
shown by `stalwart jobs` and `stalwart job status`."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest
import torch

from stalwart import models
from stalwart.api import common, coordinator
from stalwart.client import CoordinatorClient
from tests.helpers import assert_eventually_async
from tests.integration.coordinator.support import wait_leader

from .conftest import ROOT
from .test_trainer_with_coordinator import trainer_status, wait_job_done

pytestmark = pytest.mark.timeout(300)

BROKEN = "tests.integration.trainer.broken_task"


def _spec(model: str, slots: int = 2) -> coordinator.JobSpec:
    spec = models.default_spec("mlp", num_slots=slots, steps=5, batch_size=8)
    spec.model = model
    return spec


async def _cluster(procs, trainers: int, *paramserver_args: str):
    coord = procs.coordinator("c1")
    await wait_leader(coord.address)
    join = ("--coordinator", coord.address)
    backup = procs.start("services.paramserver", "ps-b", "--role", "backup", *join,
                         *paramserver_args)  # fmt: skip
    procs.start("services.paramserver", "ps-p", "--role", "primary", "--backups", backup.address,
                *join, *paramserver_args)  # fmt: skip
    names = [f"tr{i}" for i in range(trainers)]
    started = [procs.trainer(name, *join) for name in names]
    return coord, started


async def _registered(client: CoordinatorClient, names: set[str]) -> None:
    async def all_there():
        nodes = await client.all_nodes(common.NODE_ROLE_TRAINER)
        assert {n.node_id for n in nodes} == names

    await assert_eventually_async(all_there, timeout=60)


def _cli(*args: str) -> str:
    env = {**os.environ, "COLUMNS": "400"}  # a table wide enough for the whole reason
    done = subprocess.run([sys.executable, "-m", "stalwart.cli.main", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize(
    ("task", "words"),
    [("loss_raises", "ValueError: the loss went wrong at "),
     ("wrong_shape", "mat1 and mat2 shapes cannot be multiplied")],
)  # fmt: skip
async def test_a_bug_in_the_task_fails_the_job_and_the_trainers_stay_up(cluster_procs, task, words):
    coord, trainers = await _cluster(cluster_procs, 2)
    async with CoordinatorClient(coord.address) as client:
        await _registered(client, {"tr0", "tr1"})
        job = await client.create_job(_spec(f"{BROKEN}:{task}"), job_id="broken")
        done = await wait_job_done(client, job.job_id, 120)
        assert done.state == coordinator.JOB_STATE_FAILED
        assert words in done.reason and "(on 2 trainers)" in done.reason, done.reason
        if task == "loss_raises":
            assert "broken_task.py:" in done.reason and "in loss" in done.reason  # user's line
        # the trainers were never killed by it: alive, registered, answering
        for proc in trainers:
            assert proc.alive()
            assert (await trainer_status(proc.address)).node_id == proc.name.split("-", 1)[1]
        nodes = await client.all_nodes(common.NODE_ROLE_TRAINER)
        assert {n.state for n in nodes} == {coordinator.NODE_STATE_ALIVE}
    table = await asyncio.to_thread(_cli, "jobs", "--coordinator", coord.address)
    assert " failed " in table and "user code failed at step 0" in table
    status = json.loads(await asyncio.to_thread(
        _cli, "job", "status", "broken", "--coordinator", coord.address, "-o", "json"))  # fmt: skip
    assert status["state"] == "JOB_STATE_FAILED" and words in status["reason"]


@pytest.mark.parametrize(
    ("model", "words"),
    [("tests.integration.trainer.broken_import:make",
      "RuntimeError: cannot load the vocabulary file at "),
     ("tests.integration.trainer.no_such_module:make", "cannot import")],
)  # fmt: skip
async def test_a_model_that_cannot_be_imported_fails_the_job(cluster_procs, model, words):
    coord, (trainer,) = await _cluster(cluster_procs, 1)
    async with CoordinatorClient(coord.address) as client:
        await _registered(client, {"tr0"})
        job = await client.create_job(_spec(model, slots=1), job_id="unloadable")
        done = await wait_job_done(client, job.job_id, 60)
        assert done.state == coordinator.JOB_STATE_FAILED
        assert done.reason.startswith("the model cannot be loaded: ") and words in done.reason
        assert trainer.alive()


@pytest.mark.parametrize(
    "mode", [common.CONSISTENCY_MODE_SYNC, common.CONSISTENCY_MODE_ASYNC], ids=["sync", "async"]
)
async def test_a_job_whose_weights_diverge_fails_with_that_reason(cluster_procs, mode):
    """lr 1e30 is valid (finite in float32), but after step 0 the weights are so large
    (Adam's first step moves each by about lr) that every trainer computes NaN: the
    paramserver refuses those gradients, and the trainers report it as the job's own
    error instead of retrying for ever. In either mode: an async job used to retry."""
    coord, trainers = await _cluster(cluster_procs, 2)
    spec = _spec("mlp")
    spec.optimizer.lr = 1e30
    spec.consistency.mode = mode
    async with CoordinatorClient(coord.address) as client:
        await _registered(client, {"tr0", "tr1"})
        job = await client.create_job(spec, job_id="diverging")
        done = await wait_job_done(client, job.job_id, 120)
        assert done.state == coordinator.JOB_STATE_FAILED, done
        assert "NonFiniteGradient: the gradient holds NaN or Inf" in done.reason, done.reason
        # async: each slot's first push is applied, so the weights moved by lr once or twice
        assert "e+30 in magnitude" in done.reason and "(on 2 trainers)" in done.reason
        assert all(proc.alive() for proc in trainers)


@pytest.mark.parametrize(
    "mode", [common.CONSISTENCY_MODE_SYNC, common.CONSISTENCY_MODE_ASYNC], ids=["sync", "async"]
)
async def test_a_gradient_not_finite_from_the_first_push_fails_the_job(cluster_procs, mode):
    """NaN from step 0: in async mode a trainer's first push of a slot asks the slot's
    step (a probe the paramserver refuses with it), and the probe's NaN was refused
    first, as NON_FINITE, which the trainer retried for ever."""
    coord, trainers = await _cluster(cluster_procs, 2)
    spec = _spec(f"{BROKEN}:loss_nan")
    spec.consistency.mode = mode
    async with CoordinatorClient(coord.address) as client:
        await _registered(client, {"tr0", "tr1"})
        job = await client.create_job(spec, job_id="nan-from-the-start")
        done = await wait_job_done(client, job.job_id, 120)
        assert done.state == coordinator.JOB_STATE_FAILED, done
        assert "NonFiniteGradient: the gradient holds NaN or Inf" in done.reason, done.reason
        assert all(proc.alive() for proc in trainers)


@pytest.mark.parametrize("what", ["wide", "many-slots"])
async def test_a_model_too_large_for_the_paramservers_fails_its_job_and_no_other(
    cluster_procs, what
):
    """Refused at RegisterModel from its header, before a byte of it is read: the job
    fails with the size in its reason, and the same paramservers train the next job.
    Too large by its width, or by its slots: a sync step stages each slot's push, and
    a job of 1,000 slots was taken and held until the OOM killer ended the replica."""
    # the default mlp, 2 slots: about 13.6 MiB of parameters, 7 copies with Adam
    budget = 150 << 20
    coord, trainers = await _cluster(cluster_procs, 2, "--memory-budget-bytes", str(budget))
    async with CoordinatorClient(coord.address) as client:
        await _registered(client, {"tr0", "tr1"})
        large = _spec("mlp", slots=2 if what == "wide" else 64)
        if what == "wide":
            large.model_args["hidden"] = "2048"
        job = await client.create_job(large, job_id="too-large")
        done = await wait_job_done(client, job.job_id, 120)
        assert done.state == coordinator.JOB_STATE_FAILED, done
        assert "ModelTooLarge: the model needs about " in done.reason, done.reason
        assert "MiB on a paramserver" in done.reason and "(on 2 trainers)" in done.reason
        small = await client.create_job(_spec("mlp"), job_id="fits")
        done = await wait_job_done(client, small.job_id, 180)
        assert done.state == coordinator.JOB_STATE_SUCCEEDED, done
        assert all(proc.alive() for proc in trainers)


async def test_a_model_too_large_for_the_trainers_is_never_allocated(cluster_procs):
    """hidden 65536 in 16 layers: 240 GiB of weights, and a trainer needs three times
    that: more than any machine that runs this suite has. Measured on torch's meta
    device, nothing allocated."""
    coord, trainers = await _cluster(cluster_procs, 2)
    async with CoordinatorClient(coord.address) as client:
        await _registered(client, {"tr0", "tr1"})
        huge = _spec("mlp")
        huge.model_args.update(hidden="65536", layers="16")
        job = await client.create_job(huge, job_id="huge")
        done = await wait_job_done(client, job.job_id, 120)
        assert done.state == coordinator.JOB_STATE_FAILED, done
        assert "ModelTooLarge: the model holds 245,830 MiB" in done.reason, done.reason
        assert "MiB of parameters and buffers; a trainer needs about 3 times" in done.reason
        assert "more memory than this one has available (on 2 trainers)" in done.reason
        assert all(proc.alive() for proc in trainers)


@pytest.mark.parametrize("kind", ["not-safetensors", "another-model"])
async def test_init_from_weights_that_cannot_be_used_fail_the_job(cluster_procs, tmp_path, kind):
    """Before, a file that is no safetensors at all ended the trainer that read it, and
    one of another model's shapes left the job RUNNING at step 0 for good."""
    path = tmp_path / "weights.safetensors"
    if kind == "not-safetensors":
        path.write_bytes(b"\xff" * 64)
        words = "JobSpecError: cannot read weights"
    else:
        from safetensors.torch import save_file

        save_file({"net.0.weight": torch.zeros(3, 3)}, str(path))
        words = "JobSpecError: "
    coord, trainers = await _cluster(cluster_procs, 2)
    spec = _spec("mlp")
    spec.init_from = str(path)
    async with CoordinatorClient(coord.address) as client:
        await _registered(client, {"tr0", "tr1"})
        job = await client.create_job(spec, job_id=kind)
        done = await wait_job_done(client, job.job_id, 120)
        assert done.state == coordinator.JOB_STATE_FAILED, done
        assert words in done.reason and "(on 2 trainers)" in done.reason, done.reason
        assert all(proc.alive() for proc in trainers)
