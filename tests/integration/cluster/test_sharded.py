"""A job spread over two shard groups, on a cluster of real processes.

A primary killed while a step's pushes arrive can leave that step committed on one
group and not on the other (its pushes never reached the promoted backup). The
trainers must finish the step on the lagging group from the weights they hold; they
used to wait for ever for the groups to agree. A job asking for more groups than the
cluster has is refused at once instead of standing at step 0. A group that loses
every replica is restored from a checkpoint onto a stand-in while the other group
keeps its state; the trainers' registration with the lost group is dropped when the
restore moves it (it used to retry against the dead primary for a minute first).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from stalwart import cluster, models
from stalwart.api import common, coordinator
from stalwart.client.coordinator import CoordinatorClient
from tests.integration.cluster.support import (
    JOB_TIMEOUT_S,
    assert_bitwise_equal,
    reference,
    run_job,
    running_cluster,
    small_spec,
    watched_job,
)
from tests.integration.cluster.test_cli import EXIT_INVALID_INPUT, one_error_line, stalwart

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

EXIT_REFUSED = 4  # stalwart.cli.output.ExitCode: any other refusal by the cluster


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cluster.LocalCluster]:
    """2 coordinators; 2 shard groups of primary, backup and spare; 2 trainers, 1 standby."""
    root = Path(tmp_path_factory.mktemp("runs"))
    with running_cluster(root, trainers=2, standbys=1, shards=2) as started:
        yield started


def test_primaries_killed_in_each_group_mid_job_keep_it_bitwise_equal(sharded):
    spec = small_spec(steps=60)
    spec.num_shards = 2
    want = reference(spec)
    schedule = [("paramserver:1", 15), ("paramserver:0", 30), ("trainer", 40)]
    out = asyncio.run(run_job(sharded, spec, schedule=schedule))
    assert out.job.reason == "reached step 60", out.job.reason
    assert out.version == 60
    assert [name[:4] for name, _ in out.kills] == ["ps-1", "ps-0", "trai"], out.kills
    assert_bitwise_equal(out.weights, want)


def test_a_model_of_one_tensor_over_two_groups_trains_bitwise_equal(sharded):
    # Group 1 holds nothing: it used to refuse the model (INTERNAL) and the job stood at
    # step 0. It loses every replica at step 25 and is restored from the checkpoint of
    # step 20, which holds its counters and no tensor (the restore used to refuse that).
    sgd = common.OptimizerSpec(kind=common.OPTIMIZER_KIND_SGD, lr=0.05, momentum=0.9)
    spec = models.default_spec("tests.integration.cluster.one_tensor_task:make", optimizer=sgd,
                               num_slots=2, steps=40, batch_size=16, seed=5)  # fmt: skip
    spec.num_shards, spec.checkpoint_interval = 2, 10
    want = reference(spec)
    assert list(want) == ["weight"]
    out = asyncio.run(run_job(sharded, spec, schedule=[("group:1", 25)]))
    assert out.job.reason == "reached step 40", out.job.reason
    assert out.version == 40
    assert any(e.kind == "CHECKPOINT_RESTORED" for e in out.events), out.events[-5:]
    assert_bitwise_equal(out.weights, want)


def test_more_shards_than_groups_is_refused_in_one_line(sharded):
    target = ("--coordinator", ",".join(sharded.coordinator_addresses))
    done = stalwart("job", "submit", "--shards", "3", "--steps", "5", *target)
    assert done.returncode == EXIT_REFUSED, done.stderr
    line = one_error_line(done)
    assert "asks for 3 shard groups" in line and "none for 2" in line, line
    listed = stalwart("jobs", "-o", "json", *target)
    assert listed.returncode == 0, listed.stderr
    assert '"num_shards": 3' not in listed.stdout, "the refused job was admitted"


def test_char_lm_over_two_groups_runs_without_its_default_clip(sharded):
    # its default global-norm clip cannot span groups; one asked for is refused
    target = ("--coordinator", ",".join(sharded.coordinator_addresses))
    flags = ("job", "submit", "--model", "char-lm", "--shards", "2", "--steps", "3", *target)
    done = stalwart(*flags, "--wait", "-o", "json", timeout=240)
    assert done.returncode == 0, done.stderr
    job = json.loads(done.stdout)
    assert job["state"] == "JOB_STATE_SUCCEEDED", job
    assert "clip_grad_norm" not in job["spec"]["optimizer"] or not float(
        job["spec"]["optimizer"]["clip_grad_norm"]
    ), job["spec"]
    asked = stalwart(*flags, "--clip-grad-norm", "0.5")
    assert asked.returncode == EXIT_INVALID_INPUT, asked.stderr
    assert "clip_grad_norm needs num_shards 1" in one_error_line(asked)


def test_a_group_losing_every_replica_is_restored_and_the_job_ends_bitwise_equal(sharded):
    spec = small_spec(steps=80)
    spec.num_shards, spec.checkpoint_interval = 2, 10
    want = reference(spec)
    out = asyncio.run(run_job(sharded, spec, schedule=[("group:1", 25)]))
    assert out.job.state == coordinator.JOB_STATE_SUCCEEDED, out.job.reason
    assert out.version == spec.steps
    assert any(e.kind == "CHECKPOINT_RESTORED" for e in out.events), out.events[-5:]
    assert_bitwise_equal(out.weights, want)


def test_ckpt_create_checkpoints_both_groups_of_a_running_job(sharded):
    target = ("--coordinator", ",".join(sharded.coordinator_addresses))
    spec = small_spec(steps=5000)  # long enough to be running throughout
    spec.num_shards = 2
    job_id = asyncio.run(_started(sharded, spec))
    try:
        made = stalwart("ckpt", "create", job_id, "-o", "json", *target, timeout=240)
        assert made.returncode == 0, made.stderr
        manifest = json.loads(made.stdout)
        step = int(manifest["step"])  # int64: a string in proto JSON
        assert manifest["job_id"] == job_id and step > 0
        versions = {int(s["shard"]): int(s["version"]) for s in manifest["shards"]}
        assert versions == {0: step, 1: step}, manifest["shards"]
        checked = stalwart("ckpt", "verify", manifest["checkpoint_id"], "-o", "json", *target)
        assert checked.returncode == 0 and json.loads(checked.stdout)["ok"], checked.stderr
        # -j names another job: refused, and the checkpoint is still there
        other = stalwart("ckpt", "rm", manifest["checkpoint_id"], "-j", "another-job", *target)
        assert other.returncode == EXIT_INVALID_INPUT, other.stderr
        assert f"belongs to job {job_id!r}, not to 'another-job'" in one_error_line(other)
        kept = stalwart("ckpt", "show", manifest["checkpoint_id"], "-j", job_id, *target)
        assert kept.returncode == 0, kept.stderr
    finally:
        stalwart("job", "cancel", job_id, *target)
    ended = stalwart("ckpt", "create", job_id, *target)
    assert ended.returncode == EXIT_REFUSED, ended.stderr
    assert "running" in one_error_line(ended)


async def _started(local: cluster.LocalCluster, spec) -> str:
    async with (
        CoordinatorClient(local.coordinator_addresses, retry_for_s=30.0) as client,
        watched_job(client, spec) as (job, recorder),
    ):
        assert await recorder.wait_step(5, JOB_TIMEOUT_S), "job never got to step 5"
    return job.job_id
