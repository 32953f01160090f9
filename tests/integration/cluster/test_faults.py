"""kill -9 of a trainer, the paramserver primary and the coordinator leader mid-job: each
job still completes, and its final weights equal a fault-free run bit for bit.

The tests share one cluster (see conftest.py) and run in file order; each kills
one member of a kind the cluster has a spare of.
"""

from __future__ import annotations

import asyncio

import pytest

from stalwart.api import coordinator
from tests.integration.cluster.support import assert_bitwise_equal, reference, run_job, small_spec

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.timeout(420)]


def _finished_ok(outcome, spec) -> None:
    assert outcome.job.state == coordinator.JOB_STATE_SUCCEEDED, outcome.job.reason
    assert outcome.version == spec.steps
    committed = [e.step for e in outcome.events
                 if e.kind == "STEP_COMMITTED" and e.job_id == outcome.job.job_id]  # fmt: skip
    # announcements are at most once per step (a leader killed between storing the
    # job and its events skips some); the weights say whether any step was lost
    assert set(committed) <= set(range(1, spec.steps + 1))
    assert len(committed) == len(set(committed)), "a step was announced twice"


def test_trainer_killed_standby_takes_the_slot_at_the_current_step(local):
    spec = small_spec(steps=40, seed=3)
    out = asyncio.run(run_job(local, spec, kill="trainer", at_step=10))
    _finished_ok(out, spec)
    dead = [e for e in out.events if e.kind == "NODE_DEAD" and e.node_id == out.killed]
    assert dead, f"{out.killed}'s death was never announced"
    promoted = [
        e for e in out.events if e.kind == "STANDBY_PROMOTED" and e.sequence > dead[0].sequence
    ]
    assert promoted, "no standby was promoted"
    # The standby takes the slot at the job's current step: the highest step
    # committed before the promotion, with nothing skipped or repeated after it.
    # Announcements trail the paramserver (the leader polls it), so the promotion
    # step is at or past the last step announced before it; the bitwise check
    # below proves nothing was skipped or repeated.
    before = [e.step for e in out.events
              if e.kind == "STEP_COMMITTED" and e.sequence < promoted[0].sequence]  # fmt: skip
    assert promoted[0].step >= max(before, default=0)
    assert promoted[0].step >= out.killed_at_step
    assert_bitwise_equal(out.weights, reference(spec))


def test_paramserver_primary_killed_backup_promoted_weights_bitwise(local):
    spec = small_spec(steps=40, seed=4)
    out = asyncio.run(run_job(local, spec, kill="paramserver", at_step=10))
    _finished_ok(out, spec)
    assert any(e.kind == "REPLICA_PROMOTED" for e in out.events), "no backup was promoted"
    assert_bitwise_equal(out.weights, reference(spec))


def test_coordinator_leader_killed_standby_leads_weights_bitwise(local):
    spec = small_spec(steps=40, seed=5)
    out = asyncio.run(run_job(local, spec, kill="coordinator", at_step=10))
    _finished_ok(out, spec)
    assert any(e.kind == "LEADER_ELECTED" and e.node_id != out.killed for e in out.events)
    assert_bitwise_equal(out.weights, reference(spec))
