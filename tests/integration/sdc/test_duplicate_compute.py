"""A bit flipped in one trainer's gradient is caught by sampled duplicate compute before
it is pushed: that trainer is quarantined, the standby recomputes its slot, and the job
ends bitwise equal to the fault-free reference run."""

from __future__ import annotations

import asyncio

import pytest

from stalwart import training
from stalwart.api import common, coordinator
from stalwart.client import CoordinatorClient
from tests.integration.trainer.support import assert_bitwise_equal, final_weights, small_spec

from .support import job_events, start_cluster, wait_job_done

pytestmark = pytest.mark.timeout(240)


async def test_bit_flip_is_outvoted_quarantined_and_never_applied(cluster_procs):
    procs = cluster_procs
    spec = small_spec(steps=8, duplicate_compute_rate=1.0)
    training.make_deterministic()
    want = await asyncio.to_thread(training.reference_run, spec)
    coord, _, primary, backup = await start_cluster(procs, {"tr1": "flip_bit_at_step=3"})
    flipper = next(p for p in procs.procs if p.name.endswith("-tr1"))

    async with CoordinatorClient(coord.address) as client:
        job = await client.create_job(spec, job_id="job-flip")
        done = await wait_job_done(client, job.job_id, 180)
        assert done.state == coordinator.JOB_STATE_SUCCEEDED, done.reason
        nodes = {n.node_id: n for n in await client.all_nodes(common.NODE_ROLE_TRAINER)}
        events = await job_events(client)

    assert "flip_bit_at_step" in flipper.log_tail(400)  # the fault really fired
    assert nodes["tr1"].state == coordinator.NODE_STATE_QUARANTINED
    assert {n for n in nodes if nodes[n].state == coordinator.NODE_STATE_QUARANTINED} == {"tr1"}
    quarantined = [e for e in events if e.kind == common.EVENT_KIND_NODE_QUARANTINED]
    assert [e.node_id for e in quarantined] == ["tr1"]
    assert "step 3" in quarantined[0].message and "duplicate compute" in quarantined[0].message
    promoted = [e.node_id for e in events if e.kind == common.EVENT_KIND_STANDBY_PROMOTED]
    assert promoted == ["sb"]
    version, got = await final_weights([primary.address, backup.address], job.job_id, spec)
    assert version == spec.steps
    assert_bitwise_equal(got, want)  # the flipped gradient was never applied
