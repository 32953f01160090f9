"""Finished jobs' models leave the paramservers past --keep-finished-models, from the
primary and its backup; a running job's model and the newest finished one stay, and
exporting a released job says what to do instead."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from stalwart import exporting, models, schedule, training
from stalwart.api import common
from stalwart.client import CoordinatorClient
from stalwart.demo.watch import param_client
from stalwart.errors import ErrorKind, StalwartError
from tests.helpers import assert_eventually_async
from tests.integration.coordinator.support import wait_leader
from tests.integration.coordinator.test_paramserver_failover import replica_status

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[3]


async def register(client: CoordinatorClient, job_id: str, spec) -> None:
    """What a trainer does when it gets the job's first assignment."""
    ps = await param_client(client, job_id, spec)
    try:
        initial = training.initial_params(models.resolve(spec), spec.seed)
        await ps.register_model(job_id, initial, schedule.resolved(spec.optimizer, spec.steps),
                                spec.consistency, spec.num_slots)  # fmt: skip
    finally:
        await ps.close()


async def held(address: str) -> set[str]:
    return {j.job_id for j in (await replica_status(address)).jobs}


async def test_finished_models_past_the_limit_are_deleted_from_every_replica(cluster):
    coord = cluster.coordinator("c1", "--keep-finished-models", "1")
    await wait_leader(coord.address)
    join = ("--coordinator", coord.address)
    backup = cluster.paramserver("ps-b", "--role", "backup", *join)
    primary = cluster.paramserver("ps-p", "--role", "primary", "--backups", backup.address, *join)
    spec = models.default_spec("digits-cnn", model_args={"width": "4"}, num_slots=1, steps=5)
    jobs = ["first", "second", "third", "running"]
    async with CoordinatorClient(coord.address) as client:

        async def both_polled():
            nodes = await client.all_nodes(common.NODE_ROLE_PARAMSERVER)
            assert {n.node_id: n.replica_role for n in nodes} == {
                "ps-p": common.REPLICA_ROLE_PRIMARY,
                "ps-b": common.REPLICA_ROLE_BACKUP,
            }

        await assert_eventually_async(both_polled, timeout=60)
        for job_id in jobs:
            await client.create_job(spec, job_id=job_id)
            await register(client, job_id, spec)

        async def on_both(want: set[str]):
            assert (await held(primary.address), await held(backup.address)) == (want, want)

        await assert_eventually_async(lambda: on_both(set(jobs)), timeout=30)
        for job_id in ["first", "second", "third"]:  # ended in this order
            await client.cancel_job(job_id, "done with it")
        await assert_eventually_async(lambda: on_both({"third", "running"}), timeout=30)

        with pytest.raises(StalwartError) as caught:
            await exporting.pull_live(client, "first")
        assert caught.value.kind is ErrorKind.UNKNOWN_JOB
        assert "--keep-finished-models" in caught.value.message
        assert "--checkpoint" in caught.value.message
        kept = await exporting.pull_live(client, "third")
        assert kept.version == 0 and kept.weights

    # its metrics: no rows, and a note on stderr saying why (it used to be an empty
    # table and nothing else)
    target = ("--coordinator", coord.address)
    shown = await asyncio.to_thread(_cli, "job", "metrics", "first", *target)
    assert shown.returncode == 0, shown.stderr
    assert "no longer hold its history" in shown.stderr and "--keep-finished-models" in shown.stderr
    listed = await asyncio.to_thread(_cli, "job", "metrics", "first", "-o", "json", *target)
    assert listed.returncode == 0 and json.loads(listed.stdout) == [] and not listed.stderr


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stalwart.cli.main", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
