"""Dead nodes do not pile up: one dead for --forget-dead-after-seconds that no live job
or shard group names is removed from the membership and the store; named ones, the
recently dead and quarantined ones stay."""

from __future__ import annotations

import asyncio
import time

from services.coordinator.membership import Membership, NodeRecord, NodeState, Role
from services.coordinator.settings import CoordinatorSettings
from tests.unit.coordinator.leaders import elected


def _node(node_id: str, state: NodeState, ended: float, role=Role.TRAINER) -> NodeRecord:
    return NodeRecord(node_id, role, f"{node_id}:1", state=state, lease_expires=ended)


def test_only_the_long_dead_and_unnamed_are_forgotten() -> None:
    members = Membership(3.0)
    members.nodes = {n.node_id: n for n in (
        _node("old", NodeState.DEAD, 100.0),
        _node("named", NodeState.DEAD, 100.0),
        _node("recent", NodeState.DEAD, 950.0),
        _node("quarantined", NodeState.QUARANTINED, 100.0),
        _node("alive", NodeState.ALIVE, 100.0),
    )}  # fmt: skip
    asked = []

    def named() -> set[str]:
        asked.append(True)
        return {"named"}

    assert members.forget_dead(1000.0, 600.0, named) == ["old"]
    assert sorted(members.nodes) == ["alive", "named", "quarantined", "recent"]
    assert members.forget_dead(1000.0, 600.0, named) == [] and len(asked) == 2
    assert members.forget_dead(1000.0, 5000.0, named) == [] and len(asked) == 2  # none due


def test_the_leader_deletes_forgotten_nodes_from_the_store(tmp_path) -> None:
    url = f"shm://{tmp_path}/state"
    control = elected(url, 1)
    control.settings = CoordinatorSettings(store_url=url, forget_dead_after_seconds=60)
    for node_id in ("gone-pod", "ps-primary", "t-live"):
        role = Role.PARAMSERVER if node_id.startswith("ps") else Role.TRAINER
        asyncio.run(control.register(NodeRecord(node_id, role, f"{node_id}:1")))
    long_ago = time.time() - 3600
    for node_id in ("gone-pod", "ps-primary"):
        node = control.members.nodes[node_id]
        node.state, node.lease_expires = NodeState.DEAD, long_ago
        control._dirty_nodes.add(node_id)  # as a death does, before the same tick
    control.groups[0] = ("ps-primary", 1)  # a shard group still names it
    asyncio.run(control.tick())
    assert sorted(control.members.nodes) == ["ps-primary", "t-live"]
    assert sorted(n.node_id for n in control.state.nodes()) == ["ps-primary", "t-live"]

    successor = elected(url, 2)
    assert sorted(successor.members.nodes) == ["ps-primary", "t-live"]
