"""A primary that its supervisor restarts at once, under the same node id and address,
before the leader finds it dead (as `docker compose` does with `restart:
unless-stopped`), with real processes.

The new process claims primary at the group's epoch again and holds nothing. The
leader tells it from the old one by the instance id in its status and promotes the
backup, which holds every acknowledged step; the trainers' attempts to register fresh
weights on the new process are refused meanwhile. The job finishes bitwise equal to
the fault-free reference run."""

from __future__ import annotations

import asyncio
import time

import pytest

from stalwart import training
from stalwart.api import common, coordinator
from stalwart.client import CoordinatorClient
from tests.integration.coordinator.support import wait_leader
from tests.integration.sdc.support import job_events

from .support import assert_bitwise_equal, final_weights, small_spec, wait_trainers
from .test_trainer_with_coordinator import wait_job_done

pytestmark = pytest.mark.timeout(300)

CRASH_AT = 5
# The leader must not find the old process dead before the new one answers: no
# refused-poll rule, and a lease far longer than a restart takes.
SLOW_DETECTION = ("--paramserver-unreachable-polls", "0", "--node-lease-seconds", "120")


async def wait_gone(proc, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while proc.alive():
        assert time.monotonic() < deadline, proc.log_tail(50)
        await asyncio.sleep(0.05)


async def test_a_primary_restarted_empty_under_its_id_loses_its_group_to_its_backup(
    cluster_procs,
):
    procs = cluster_procs
    spec = small_spec(steps=16)
    training.make_deterministic()
    want = await asyncio.to_thread(training.reference_run, spec)

    coord = procs.coordinator("c1", *SLOW_DETECTION)
    await wait_leader(coord.address)
    join = ("--coordinator", coord.address)
    backup = procs.start("services.paramserver", "ps-b", "--role", "backup", *join)
    primary_args = ("--role", "primary", "--backups", backup.address, *join)
    primary = procs.start("services.paramserver", "ps-p", *primary_args,
                          env={"STALWART_FAULTS": f"crash_at_version={CRASH_AT}"})  # fmt: skip
    port = primary.address.rsplit(":", 1)[1]
    for name in ("tr0", "tr1"):
        procs.trainer(name, *join)

    async with CoordinatorClient(coord.address) as client:
        await wait_trainers(client, {"tr0", "tr1"}, 30)
        job = await client.create_job(spec, job_id="job-restart")
        await wait_gone(primary, 120)
        assert "fault fired" in primary.log_tail(200)
        again = procs.launch("services.paramserver", "ps-p-again", "--node-id", "ps-p",
                             *primary_args, "--port", port)  # fmt: skip
        assert again.address == primary.address
        done = await wait_job_done(client, job.job_id, 180)
        assert done.state == coordinator.JOB_STATE_SUCCEEDED, done.reason
        events = await job_events(client)

    promoted = [e for e in events if e.kind == common.EVENT_KIND_REPLICA_PROMOTED]
    assert [(e.node_id, e.attributes["previous"]) for e in promoted] == [("ps-b", "ps-p")]
    version, got = await final_weights([backup.address], job.job_id, spec)
    assert version == spec.steps
    assert_bitwise_equal(got, want)
