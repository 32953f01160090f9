"""A job that uses every update-rule feature — dropout and LayerNorm in the model, AdamW,
warmup + cosine schedule, clipping by global norm, MEAN reduction, two micro-batches —
survives kill -9 of a trainer and of the paramserver primary, bitwise equal to
reference_run (same masks, same rates, same clipped gradients whoever computed them)."""

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
