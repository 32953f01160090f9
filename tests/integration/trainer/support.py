"""Helpers of the trainer integration tests: specs, assignment files, final weights."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from google.protobuf import json_format

from stalwart import models, training
from stalwart.api import coordinator
from stalwart.client.paramserver import ParamServerClient, ShardGroupClient, replica_channels


def small_spec(**overrides) -> coordinator.JobSpec:
    """A digits-cnn job small enough for two shared cores (a few seconds)."""
    fields = dict(model_args={"width": "8"}, num_slots=2, steps=12, batch_size=16, seed=7)
    fields.update(overrides)
    return models.default_spec("digits-cnn", **fields)


def write_assignment(
    path: Path, job_id: str, spec, slot: int, primary: str, backups: list[str], standby=False
) -> Path:
    shard_map = coordinator.GetShardMapResponse(
        groups=[coordinator.ShardGroup(shard=0, primary_address=primary, backup_addresses=backups)]
    )
    assignment = coordinator.Assignment(
        job_id=job_id, spec=spec, slot=slot, shard_map=shard_map, standby=standby
    )
    path.write_text(json_format.MessageToJson(assignment))
    return path


async def final_weights(
    addresses: list[str], job_id: str, spec, token: str | None = None
) -> tuple[int, dict]:
    """Pull the job's weights once its version reaches spec.steps (``token``: the
    role token to pull with, where the replicas have tokens configured)."""
    client = ParamServerClient([ShardGroupClient(addresses, replica_channels(token=token))])
    client.plan(training.initial_params(models.resolve(spec), spec.seed))
    try:
        versions, params = await client.pull(job_id, -1, spec.steps)
        return versions[0], params
    finally:
        await client.close()


def assert_bitwise_equal(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for name in want:
        assert torch.equal(got[name], want[name]), f"{name} differs from the reference run"


def wait_exit(proc, timeout: float) -> int:
    """Wait for a process to exit by itself; fail with its log tail if it does not."""
    deadline = time.monotonic() + timeout
    while proc.alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not proc.alive(), f"{proc.name} still running after {timeout}s:\n{proc.log_tail()}"
    return proc.returncode


async def coordinated_paramservers(procs, *coordinator_args: str) -> tuple[tuple[str, str], list]:
    """A leading coordinator (started with ``coordinator_args``) and a paramserver pair
    joined to it: (the trainers' ``--coordinator`` flags, [primary, backup])."""
    from tests.integration.coordinator.support import wait_leader

    coord = procs.coordinator("c1", *coordinator_args)
    await wait_leader(coord.address)
    join = ("--coordinator", coord.address)
    backup = procs.start("services.paramserver", "ps-b", "--role", "backup", *join)
    primary = procs.start(
        "services.paramserver", "ps-p", "--role", "primary", "--backups", backup.address, *join
    )
    return join, [primary, backup]


async def wait_trainers(client, names: set[str], timeout: float) -> None:
    """Until exactly these trainers are registered with the coordinator."""
    from stalwart.api import common
    from tests.helpers import assert_eventually_async

    async def registered():
        nodes = await client.all_nodes(common.NODE_ROLE_TRAINER)
        assert {n.node_id for n in nodes} == names

    await assert_eventually_async(registered, timeout=timeout)
