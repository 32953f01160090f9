"""Local SGD / DiLoCo jobs (JobSpec.local_steps > 1) on a real local cluster end bitwise
equal to reference_run of the same spec: fault-free, and with a slot's trainer killed -9
mid-job (its standby recomputes the outer step from the pulled weights, so the
pseudo-gradient it pushes is the one the dead trainer would have pushed)."""

from __future__ import annotations

import asyncio

import pytest

from stalwart import models
from stalwart.api import common, coordinator
from tests.integration.cluster.support import assert_bitwise_equal, reference, run_job

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.timeout(420)]


def diloco_spec(seed: int, **kw) -> coordinator.JobSpec:
    """DiLoCo's recipe: outer SGD with Nesterov momentum over the mean pseudo-gradient."""
    outer = common.OptimizerSpec(
        kind=common.OPTIMIZER_KIND_SGD, lr=0.7, momentum=0.9, nesterov=True
    )
    fields = dict(model_args={"width": "8"}, num_slots=2, steps=12, batch_size=16, seed=seed,
                  optimizer=outer, local_steps=4, local_lr=0.05)  # fmt: skip
    fields.update(kw)
    return models.default_spec("digits-cnn", **fields)


def _succeeded(out, spec) -> None:
    assert out.job.state == coordinator.JOB_STATE_SUCCEEDED, out.job.reason
    assert out.version == spec.steps  # versions count outer steps
    assert out.job.spec.local_steps == spec.local_steps  # stored as submitted


def test_local_sgd_job_is_bitwise_equal_to_reference_run(local):
    spec = diloco_spec(seed=21)
    out = asyncio.run(run_job(local, spec))
    _succeeded(out, spec)
    assert_bitwise_equal(out.weights, reference(spec))


def test_local_sgd_job_through_a_trainer_kill_is_bitwise_equal(local):
    """Dropout, batch norm and micro-batches inside the inner steps, and a kill -9.

    Enough outer steps that the kill lands mid-job: the step it is keyed on is read
    from the leader's events, and this small model runs 16 outer steps in about 0.3 s
    on an idle machine, so with 16 the victim had pushed its last one before it died."""
    spec = models.default_spec(
        "tests.unit.training.dropout_task:make", num_slots=2, steps=80, batch_size=8,
        micro_batches=2, seed=22, local_steps=3, local_lr=0.1,
        optimizer=common.OptimizerSpec(kind=common.OPTIMIZER_KIND_SGD, lr=0.5),
    )  # fmt: skip
    out = asyncio.run(run_job(local, spec, kill="trainer", at_step=5))
    _succeeded(out, spec)
    assert out.killed_at_step >= 5
    assert any(e.kind == "STANDBY_PROMOTED" for e in out.events), "no standby took the slot"
    assert_bitwise_equal(out.weights, reference(spec))
