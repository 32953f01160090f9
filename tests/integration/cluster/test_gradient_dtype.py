"""Gradients on the wire as bfloat16 (JobSpec.gradient_dtype): jobs on a real local
cluster end bitwise equal to reference_run of the same spec, which rounds each slot's
gradient the same way, through a kill -9 of the paramserver primary. With two slots the
primary forwards the step's float32 sum to the backup; with one it forwards each push
as it arrived, in bfloat16, and the backup widens it as the primary does."""

from __future__ import annotations

import asyncio

import pytest
import torch

from stalwart import models
from stalwart.api import common, coordinator
from tests.integration.cluster.support import assert_bitwise_equal, reference, run_job

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.timeout(420)]


def bf16_spec(num_slots: int, seed: int) -> coordinator.JobSpec:
    """Batch norm (buffers travel as float32 values) and momentum. Enough steps that
    the kill, keyed on the leader's step events, lands mid-job on a fast machine."""
    sgd = common.OptimizerSpec(kind=common.OPTIMIZER_KIND_SGD, lr=0.05, momentum=0.9)
    return models.default_spec(
        "digits-cnn", model_args={"width": "8"}, num_slots=num_slots, steps=120, batch_size=16,
        seed=seed, optimizer=sgd, gradient_dtype=common.DTYPE_BFLOAT16,
    )  # fmt: skip


@pytest.mark.parametrize("num_slots", [2, 1])
def test_bfloat16_job_bitwise_through_a_primary_kill(local, num_slots):
    spec = bf16_spec(num_slots, seed=31 + num_slots)
    out = asyncio.run(run_job(local, spec, kill="paramserver", at_step=8))
    assert out.job.state == coordinator.JOB_STATE_SUCCEEDED, out.job.reason
    assert out.version == spec.steps
    assert 8 <= out.killed_at_step < spec.steps
    assert out.job.spec.gradient_dtype == common.DTYPE_BFLOAT16  # stored as submitted
    assert any(e.kind == "REPLICA_PROMOTED" for e in out.events), "no backup was promoted"
    want = reference(spec)
    assert_bitwise_equal(out.weights, want)
    as_float32 = coordinator.JobSpec()
    as_float32.CopyFrom(spec)
    as_float32.gradient_dtype = common.DTYPE_UNSPECIFIED
    plain = reference(as_float32)
    assert any(not torch.equal(want[n], plain[n]) for n in want)  # the rounding mattered
    assert all(want[n].dtype == plain[n].dtype for n in want)
