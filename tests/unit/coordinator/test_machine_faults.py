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


def test_a_trainer_busy_with_another_job_does_not_count_as_a_taker(tmp_path) -> None:
    control = _leader_with_trainers(tmp_path, "t1", "t2")
    spec = coordinator.JobSpec(model="mlp", num_slots=1, steps=10, batch_size=1)
    asyncio.run(control.create_job("k", spec, ""))
    holder = {job_id: control.jobs[job_id].slots[0].node_id for job_id in ("j", "k")}
    assert sorted(holder.values()) == ["t1", "t2"]  # one trainer each, no one idle
    # j's trainer reports a full device: the other one is k's and never takes j's slot,
    # so draining the reporter would leave j with no trainer at all
    asyncio.run(control.task_error("j", _gpu_full(holder["j"])))
    assert control.jobs["j"].state.value == "failed"
    assert control.members.nodes[holder["j"]].state is NodeState.ALIVE
    assert control.jobs["k"].state.value != "failed"


def test_a_predicted_failure_drains_only_a_trainer_whose_slots_could_move(tmp_path) -> None:
    control = _leader_with_trainers(tmp_path, "t1")
    holder = control.jobs["j"].slots[0].node_id
    guess = "health service predicts a failure (risk 0.90)"
    asyncio.run(control.drain_node(holder, guess, only_if_movable=True))
    assert control.members.nodes[holder].state is NodeState.ALIVE  # the job's only one

    asyncio.run(control.register(NodeRecord("t2", Role.TRAINER, "t2:1")))
    asyncio.run(control.drain_node(holder, guess, only_if_movable=True))
    assert control.members.nodes[holder].state in (NodeState.DRAINING, NodeState.DRAINED)
