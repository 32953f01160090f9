"""A trainer whose GPU temperature climbs (test fault heat_from_step) is drained on the
health service's alert and its slot moves to the warm standby before its scripted
crash: the crash never fires, no step is lost, and the job ends bitwise equal to the
fault-free reference run."""

from __future__ import annotations

import asyncio

import pytest

from stalwart import training
from stalwart.api import common, coordinator, health, health_grpc
from stalwart.channel import open_channel
from stalwart.client import CoordinatorClient
from tests.integration.trainer.support import assert_bitwise_equal, final_weights, small_spec

from .support import job_events, start_cluster, wait_job_done

pytestmark = pytest.mark.timeout(360)  # 36 steps with 0.15 s delays, on a loaded machine
# The telemetry -> alert -> drain path races the steps to the scripted crash: on a
# machine loaded to ~16 on 2 cores, 11 steps of margin were not enough; 27 give it more.
HEAT_FROM, CRASH_AT = 3, 30


async def test_degrading_trainer_is_drained_before_its_scripted_death(cluster_procs):
    procs = cluster_procs
    spec = small_spec(steps=36)
    training.make_deterministic()
    want = await asyncio.to_thread(training.reference_run, spec)
    # delay_s keeps steps from outrunning the telemetry -> alert -> drain path
    faults = {"tr1": f"heat_from_step={HEAT_FROM},crash_at_step={CRASH_AT},delay_s=0.15"}
    coord, health_proc, primary, backup = await start_cluster(procs, faults, health=True)
    doomed = next(p for p in procs.procs if p.name.endswith("-tr1"))

    async with CoordinatorClient(coord.address) as client:
        job = await client.create_job(spec, job_id="job-heat")
        done = await wait_job_done(client, job.job_id, 180)
        assert done.state == coordinator.JOB_STATE_SUCCEEDED, done.reason
        nodes = {n.node_id: n for n in await client.all_nodes(common.NODE_ROLE_TRAINER)}
        events = await job_events(client)

    assert doomed.alive(), "the scripted crash fired: the drain came too late"
    assert nodes["tr1"].state == coordinator.NODE_STATE_DRAINED
    drained = [e for e in events if e.kind == common.EVENT_KIND_NODE_DRAINED]
    assert [e.node_id for e in drained] == ["tr1"]
    # the event says why: the health service's prediction and the rule that made it
    reason = drained[0].attributes["reason"]
    assert reason.startswith("health service predicts a failure (risk ") and "GPU at" in reason
    assert reason in drained[0].message
    promoted = [e for e in events if e.kind == common.EVENT_KIND_STANDBY_PROMOTED]
    assert [e.node_id for e in promoted] == ["sb"]
    assert HEAT_FROM < promoted[0].step < CRASH_AT  # moved after the heat, before the death
    committed = sorted(e.step for e in events if e.kind == common.EVENT_KIND_STEP_COMMITTED
                       and e.job_id == job.job_id)  # fmt: skip
    assert committed == list(range(1, spec.steps + 1))  # no lost (or repeated) step

    async with open_channel(health_proc.address) as channel:
        stub = health_grpc.HealthMonitorServiceStub(channel)
        alerts = (await stub.ListAlerts(health.ListAlertsRequest(node_id="tr1"), timeout=5)).alerts
        risk = (await stub.GetNodeRisk(health.GetNodeRiskRequest(node_id="tr1"), timeout=5)).risk
    first = [a for a in alerts if a.drain][-1]  # newest first: the last is the first raised
    assert first.kind == health.ALERT_KIND_PREDICTED_FAILURE and "GPU at" in first.message
    assert first.risk >= 0.8 and risk.risk >= 0.8
    assert "gpu_temperature_celsius" in risk.top_signals

    version, got = await final_weights([primary.address, backup.address], job.job_id, spec)
    assert version == spec.steps
    assert_bitwise_equal(got, want)
