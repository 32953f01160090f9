"""A job that uses every update-rule feature — dropout, batch norm and LayerNorm in the
model, AdamW, warmup + cosine schedule, clipping by global norm, MEAN reduction, two
micro-batches — survives kill -9 of a trainer, of the paramserver primary and, in one
job, of all three roles (trainer, primary, coordinator leader) one after another,
bitwise equal to reference_run (same masks, same rates, same clipped gradients and
buffer means whoever computed them)."""

from __future__ import annotations

import asyncio

import pytest

from stalwart import models
from stalwart.api import common, coordinator
from tests.integration.cluster.support import assert_bitwise_equal, reference, run_job

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.timeout(420)]


def everything_spec(seed: int) -> coordinator.JobSpec:
    optimizer = common.OptimizerSpec(
        kind=common.OPTIMIZER_KIND_ADAMW, lr=2e-2, weight_decay=0.01, beta2=0.95,
        clip_grad_norm=0.5, reduction=common.GRAD_REDUCTION_MEAN,
        schedule=common.LrSchedule(kind=common.LR_SCHEDULE_KIND_COSINE, warmup_steps=4),
    )  # fmt: skip
    return models.default_spec(
        "tests.unit.training.dropout_task:make", num_slots=2, steps=30, batch_size=8,
        micro_batches=2, optimizer=optimizer, seed=seed,
    )  # fmt: skip


@pytest.mark.parametrize("kill", ["trainer", "paramserver"])
def test_every_feature_bitwise_through_a_kill(local, kill):
    spec = everything_spec(seed=11 if kill == "trainer" else 12)
    out = asyncio.run(run_job(local, spec, kill=kill, at_step=8))
    assert out.job.state == coordinator.JOB_STATE_SUCCEEDED, out.job.reason
    assert out.version == spec.steps
    want = "STANDBY_PROMOTED" if kill == "trainer" else "REPLICA_PROMOTED"
    assert any(e.kind == want for e in out.events), f"no {want} after killing the {kill}"
    assert_bitwise_equal(out.weights, reference(spec))


def test_every_feature_bitwise_through_trainer_primary_and_leader_kills(local):
    """One job, three kill -9s: a slot's trainer, then the paramserver primary, then the
    coordinator leader (each once the job has moved past the previous one)."""
    spec = everything_spec(seed=13)
    spec.steps = 40
    schedule = [("trainer", 8), ("paramserver", 18), ("coordinator", 28)]
    out = asyncio.run(run_job(local, spec, schedule=schedule))
    assert out.job.state == coordinator.JOB_STATE_SUCCEEDED, out.job.reason
    assert out.version == spec.steps
    assert len(out.kills) == 3, out.kills
    assert all(got >= at for (_, got), (_, at) in zip(out.kills, schedule, strict=True))
    leader = out.kills[2][0]
    kinds = {e.kind for e in out.events}
    assert {"STANDBY_PROMOTED", "REPLICA_PROMOTED"} <= kinds, sorted(kinds)
    assert any(e.kind == "LEADER_ELECTED" and e.node_id != leader for e in out.events)
    assert_bitwise_equal(out.weights, reference(spec))
