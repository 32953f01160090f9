"""One trainer's full or broken device does not fail the job: the leader drains that
trainer, its slot moves to another, and the job fails only when a second trainer
reports the same error (services/coordinator/taskerrors.py)."""

from __future__ import annotations

import asyncio

from services.coordinator.membership import NodeRecord, NodeState, Role
from services.coordinator.taskerrors import TaskError
from stalwart.api import coordinator
from tests.unit.coordinator.leaders import elected

FULL = "CUDA out of memory. Tried to allocate 2.00 GiB"


def _gpu_full(node_id: str) -> TaskError:
    return TaskError(node_id, 0, 0, "import", "OutOfMemoryError", FULL)


def _leader_with_trainers(tmp_path, *trainers: str):
    control = elected(f"shm://{tmp_path}/state", 1)
    for node_id in trainers:
        asyncio.run(control.register(NodeRecord(node_id, Role.TRAINER, f"{node_id}:1")))
    spec = coordinator.JobSpec(model="mlp", num_slots=1, steps=10, batch_size=1)
    asyncio.run(control.create_job("j", spec, ""))
    return control


def test_the_reporter_is_drained_and_a_second_report_fails_the_job(tmp_path) -> None:
    control = _leader_with_trainers(tmp_path, "t1", "t2")
    asyncio.run(control.task_error("j", _gpu_full("t1")))
    assert control.jobs["j"].state.value != "failed"
    assert control.members.nodes["t1"].state in (NodeState.DRAINING, NodeState.DRAINED)
    assert control.members.nodes["t2"].state is NodeState.ALIVE

    asyncio.run(control.task_error("j", _gpu_full("t2")))  # the model is too large anywhere
    job = control.jobs["j"]
    assert job.state.value == "failed" and FULL in job.status.reason


def test_with_no_other_trainer_the_job_fails_as_before(tmp_path) -> None:
    control = _leader_with_trainers(tmp_path, "t1")
    asyncio.run(control.task_error("j", _gpu_full("t1")))
    job = control.jobs["j"]
    assert job.state.value == "failed" and "OutOfMemoryError" in job.status.reason
    assert control.members.nodes["t1"].state is NodeState.ALIVE
