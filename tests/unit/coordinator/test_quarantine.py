"""A quarantined machine stays quarantined, whatever its process does.

Corrupt numbers are a property of the machine: its process dying, or a verdict that
comes after it died, used to end the quarantine (DEAD, then ALIVE on registering
again, and given work)."""

from __future__ import annotations

import asyncio

from services.coordinator.membership import NodeRecord, NodeState, Role
from stalwart.api import coordinator
from tests.unit.coordinator.leaders import elected


def test_a_verdict_on_a_dead_node_quarantines_it_and_its_return_stays_so(tmp_path) -> None:
    control = elected(f"shm://{tmp_path}/state", 1)
    for node_id in ("t1", "t2"):
        asyncio.run(control.register(NodeRecord(node_id, Role.TRAINER, f"{node_id}:1")))
    spec = coordinator.JobSpec(model="mlp", num_slots=1, steps=10, batch_size=1)
    asyncio.run(control.create_job("j", spec, ""))
    control.members.declare_dead("t1")
    asyncio.run(control.quarantine("t1", "its gradient differed from a re-computation"))
    assert control.members.nodes["t1"].state is NodeState.QUARANTINED

    back = asyncio.run(control.register(NodeRecord("t1", Role.TRAINER, "t1:2")))
    assert back.state is NodeState.QUARANTINED
    assert all(s.node_id != "t1" for s in control.jobs["j"].slots)
    asyncio.run(control.take_over(2))  # a new leader reads it back from the store
    assert control.members.nodes["t1"].state is NodeState.QUARANTINED
