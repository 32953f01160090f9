"""What a new leader knows of the old one's drains and user-error counts, through the
coordination store (a real shm:// one here): the drain's reason is in its stored
event, and a second trainer's report of the same error fails the job although a
failover fell between the two reports."""

from __future__ import annotations

import asyncio

from services.coordinator.control import Control
from services.coordinator.membership import NodeRecord, NodeState, Role
from services.coordinator.taskerrors import TaskError, TaskErrors
from stalwart.api import common, coordinator
from tests.unit.coordinator.leaders import elected


def _trainer(node_id: str) -> NodeRecord:
    return NodeRecord(node_id, Role.TRAINER, f"127.0.0.1:{len(node_id)}")


def _spec(num_slots: int) -> coordinator.JobSpec:
    return coordinator.JobSpec(num_slots=num_slots, steps=10, batch_size=1)


def _drained_messages(control: Control) -> list[str]:
    return [e.message for e in control.state.events() if e.kind == common.EVENT_KIND_NODE_DRAINED]


def test_a_drain_is_finished_and_its_reason_stored_before_the_call_returns(tmp_path) -> None:
    """Why the drain reason needs no note of its own: placement vacates a draining
    node's work in the same reconcile, so NODE_DRAINED, reason included, is in the
    store (replayed by the next leader) once drain_node returns. If drains ever wait
    for something, this fails, and the reason must be stored until the drain ends."""
    url = f"shm://{tmp_path}/state"
    first = elected(url, 1)
    asyncio.run(first.register(_trainer("t1")))
    asyncio.run(first.create_job("j", _spec(1), ""))
    assert first.jobs["j"].slots[0].node_id == "t1"
    asyncio.run(first.drain_node("t1", "disk errors rising"))
    assert first.members.nodes["t1"].state is NodeState.DRAINED
    assert first.jobs["j"].slots[0].node_id == ""  # the slot waits for another trainer
    second = elected(url, 2)
    assert _drained_messages(second) == ["node t1 drained: disk errors rising"]
    assert second.members.nodes["t1"].state is NodeState.DRAINED


def _error(node_id: str, slot: int) -> TaskError:
    return TaskError(node_id, slot, step=3, phase="step", error_type="ValueError",
                     message="bad shape", location="model.py:12")  # fmt: skip


def test_user_error_counts_carry_over_to_the_next_leader(tmp_path) -> None:
    url = f"shm://{tmp_path}/state"
    first = elected(url, 1)
    for node in ("t1", "t2"):
        asyncio.run(first.register(_trainer(node)))
    asyncio.run(first.create_job("j", _spec(2), ""))
    job = asyncio.run(first.task_error("j", _error("t1", 0)))
    assert not job.finished  # one trainer's report only counts

    second = elected(url, 2)
    job = asyncio.run(second.task_error("j", _error("t2", 1)))
    assert job.finished and "bad shape" in job.status.reason and "2 trainers" in job.status.reason
    assert second.state.task_errors() == {}  # the job failed: its counts are dropped


def test_entries_load_back_into_the_same_counts() -> None:
    kept = TaskErrors()
    assert kept.record("j", _error("t1", 0)) is None
    assert kept.record("j", _error("t1", 0)) is None
    assert kept.record("other", _error("t9", 0)) is None
    taken = TaskErrors()
    taken.load("j", kept.entries("j"))
    assert taken.entries("j") == kept.entries("j") and not taken.holds("other")
    # the third report of the same slot on one trainer fails the job, on the new leader
    assert "3 times on t1" in taken.record("j", _error("t1", 0))
