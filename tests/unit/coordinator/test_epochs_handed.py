"""Two decisions of one leader never configure two replicas of a group at one epoch.

A promotion (a failover, a wedged primary's failover, a re-promotion above a stray)
and a checkpoint restore each pick the group's next epoch under the leader's lock,
but carry it out after releasing it; the group's record takes the epoch only then.
Decided meanwhile, two of them picked the same epoch for two different replicas."""

from __future__ import annotations

import asyncio

import grpc

from services.coordinator import ckptplan, promotion
from services.coordinator.paramwatch import ParamWatch, ReplicaLinks
from tests.unit.coordinator.leaders import elected


def _replica(node_id: str, role: str, epoch: int) -> promotion.ReplicaView:
    return promotion.ReplicaView(
        node_id=node_id, address=f"{node_id}:1", alive=True, role=role, epoch=epoch,
        versions={"j": 3},
    )  # fmt: skip


def test_a_failover_and_a_restore_decided_together_take_different_epochs(tmp_path) -> None:
    control = elected(f"shm://{tmp_path}/state", 1)
    control.groups[0] = ("a", 5)
    watch = ParamWatch(control, ReplicaLinks(grpc.aio.insecure_channel), unreachable_polls=3)
    # the primary "a" is dead; its backup "b" is to take over
    group = [promotion.ReplicaView(node_id="a", address="a:1", alive=False, role="primary",
                                   epoch=5, versions={"j": 3}),
             _replica("b", "backup", 5)]  # fmt: skip
    failover = watch._handed_out(0, promotion.choose_promotion(group, frozenset({"j"}), 5))
    assert isinstance(failover, promotion.Promote) and failover.epoch == 6
    # decided before the failover is carried out (the record still says epoch 5)
    target = ckptplan.restore_target(group, control.groups[0][1])
    assert target is not None and target.epoch == 6  # what it picked alone
    assert control.hand_out_epoch(0, target.epoch) == 7
    again = watch._handed_out(0, promotion.choose_promotion(group, frozenset({"j"}), 5))
    assert again.epoch == 8
    assert control.hand_out_epoch(1, 2) == 2  # each group by its own epochs


def test_a_new_leader_starts_from_the_groups_record(tmp_path) -> None:
    control = elected(f"shm://{tmp_path}/state", 1)
    assert control.hand_out_epoch(0, 6) == 6
    asyncio.run(control.take_over(2))
    assert control.epochs_handed == {}
    assert control.hand_out_epoch(0, 3) == 3
