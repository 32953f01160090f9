"""ASYNC and SSP jobs on a cluster of real processes, through trainer, primary and
leader kills.

Their trainers push each slot's own count of pushes as the step, from the newest
weights; a trainer that takes a slot over learns the count from the paramserver.
They used to push the version instead, which these modes refused as ahead of the
slot, and the job stood still at step 2. Nothing here is bitwise (updates land in
arrival order): the job must end, its weights finite and better than chance.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from stalwart import training
from stalwart.api import common, coordinator
from tests.integration.cluster.support import run_job, small_spec

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

STEPS = 150
CHANCE = 0.1  # ten digits


# The module's cluster (conftest.py) has one leader, one primary and four trainers to
# lose: the second job loses trainers only, and ends on one that holds both slots.
@pytest.mark.parametrize(
    "mode, staleness, schedule",
    [
        (common.CONSISTENCY_MODE_ASYNC, 0, [("trainer", 30), ("paramserver", 60),
                                            ("coordinator", 90)]),
        (common.CONSISTENCY_MODE_SSP, 2, [("trainer", 30), ("trainer", 90)]),
    ],
    ids=["async", "ssp"],
)  # fmt: skip
def test_an_unsynced_job_ends_through_kills(local, mode, staleness, schedule):
    spec = small_spec(steps=STEPS)
    spec.consistency.mode, spec.consistency.staleness = mode, staleness
    out = asyncio.run(run_job(local, spec, schedule=schedule))
    assert out.job.state == coordinator.JOB_STATE_SUCCEEDED, out.job.reason
    # pushes under way when the version reaches STEPS are applied too
    assert STEPS <= out.version <= STEPS + spec.num_slots - 1
    assert len(out.kills) == len(schedule), out.kills
    assert all(torch.isfinite(t).all() for t in out.weights.values())
    accuracy = training.evaluate(spec, out.weights)["accuracy"]
    print(f"\n{common.ConsistencyMode.Name(mode)}: held-out accuracy {accuracy:.3f}")
    assert accuracy > 3 * CHANCE
