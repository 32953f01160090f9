"""A shard group lost with every replica: jobs with a checkpoint wait for a restore,
jobs without one fail, and a job whose checkpoints cannot be listed right now is not
failed (FAILED is final, and it may have one): the next poll round asks again."""

from __future__ import annotations

import asyncio

import grpc

from services.coordinator.paramwatch import ParamWatch, ReplicaLinks
from services.coordinator.promotion import GroupLost
from stalwart.api import coordinator
from stalwart.errors import ErrorKind, StalwartError
from tests.unit.coordinator.leaders import elected

LOST = GroupLost("primary dead and no live backup")


class _Checkpoints:
    def __init__(self, answer: list[str] | None):
        self.answer = answer  # None: the checkpoint store does not answer

    async def list(self, job_id: str) -> list[str]:
        if self.answer is None:
            raise StalwartError(ErrorKind.UNAVAILABLE, "checkpoint store timed out")
        return self.answer


def _state_after_loss(tmp_path, answers: list[list[str] | None]) -> tuple[int, bool]:
    control = elected(f"shm://{tmp_path}/state", 1)
    spec = coordinator.JobSpec(model="mlp", num_slots=1, steps=10, batch_size=1)
    asyncio.run(control.create_job("j", spec, ""))
    watch = ParamWatch(control, ReplicaLinks(grpc.aio.insecure_channel), unreachable_polls=3)
    for answer in answers:  # one poll round each
        control.checkpoints = _Checkpoints(answer)
        asyncio.run(watch._group_lost(0, LOST))
    return control.jobs["j"].state.value, 0 in control.lost_groups


def test_an_unreadable_checkpoint_store_fails_nothing_and_is_asked_again(tmp_path) -> None:
    assert _state_after_loss(tmp_path / "a", [None]) == ("pending", False)
    assert _state_after_loss(tmp_path / "b", [None, ["ckpt-1"]]) == ("pending", True)
    assert _state_after_loss(tmp_path / "c", [None, []]) == ("failed", False)


def test_what_is_kept_per_paramserver_goes_with_a_forgotten_node(tmp_path) -> None:
    control = elected(f"shm://{tmp_path}/state", 1)
    watch = ParamWatch(control, ReplicaLinks(grpc.aio.insecure_channel), unreachable_polls=3)
    for kept in (watch._failures, watch._slow, watch._instances):
        kept.update({"ps-old": 1, "ps-now": 1})
    watch._pushed.update({"ps-old": {}, "ps-now": {}})
    watch._forget_gone({"ps-now"})  # ps-old restarted under a new id and was forgotten
    assert all(set(kept) == {"ps-now"} for kept in
               (watch._failures, watch._slow, watch._instances, watch._pushed))  # fmt: skip
