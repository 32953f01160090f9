"""Plain values for the coordinator's decision tests."""

from __future__ import annotations

from services.coordinator.jobs import Job, Running, Slot
from services.coordinator.membership import NodeRecord, NodeState, Role


def trainer(node_id: str, state: NodeState = NodeState.ALIVE, *, standby: bool = False,
            health: float = 1.0, ema: float = 0.0) -> NodeRecord:  # fmt: skip
    return NodeRecord(node_id, Role.TRAINER, f"{node_id}:1", state=state, standby=standby,
                      health_score=health, step_time_ema=ema)  # fmt: skip


def job(job_id: str = "j", slots: tuple[str, ...] = ("", ""), *, running: bool = False,
        standbys: tuple[str, ...] = (), created: float = 0.0, step: int = 0) -> Job:  # fmt: skip
    j = Job(job_id, len(slots), 100, created, step=step,
            slots=[Slot(i, n) for i, n in enumerate(slots)], standbys=list(standbys))  # fmt: skip
    if running:
        j.status = Running(created)
    return j
