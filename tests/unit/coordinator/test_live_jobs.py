"""A leader walks only the jobs still live: unfinished ones, and finished ones until
placement has released their nodes. Every job stays listed, and a new leader
rebuilds the same set from the store."""

from __future__ import annotations

import asyncio

from services.coordinator.control import Control
from services.coordinator.membership import NodeRecord, Role
from stalwart.api import coordinator
from tests.unit.coordinator.leaders import elected


def _spec() -> coordinator.JobSpec:
    return coordinator.JobSpec(model="mlp", num_slots=1, steps=10, batch_size=1)


def _heartbeat_job(control: Control, node_id: str) -> str:
    directions = asyncio.run(control.heartbeat(node_id, control.epoch, 0, None))
    return directions.job.job_id if directions.job is not None else ""


def test_finished_jobs_leave_the_walks_once_released(tmp_path) -> None:
    url = f"shm://{tmp_path}/state"
    control = elected(url, 1)
    for i in range(30):  # finished before any trainer came: they never held a node
        asyncio.run(control.create_job(f"old-{i}", _spec(), ""))
        asyncio.run(control.cancel_job(f"old-{i}", "not wanted"))
    asyncio.run(control.create_job("live", _spec(), ""))
    asyncio.run(control.register(NodeRecord("t1", Role.TRAINER, "t1:1")))
    assert set(control.live_jobs) == {"live"}
    assert control.holdings() == {"t1": ("live", (0,))}
    assert _heartbeat_job(control, "t1") == "live"

    # finished while holding t1: released by the next reconcile, then left out
    asyncio.run(control.cancel_job("live", "done with it"))
    assert "t1" not in control.holdings()
    assert control.jobs["live"].slots[0].node_id == ""  # released, not just unlisted
    assert _heartbeat_job(control, "t1") == ""
    asyncio.run(control.create_job("next", _spec(), ""))  # reconciles: t1 goes to it
    assert set(control.live_jobs) == {"next"}
    assert control.holdings() == {"t1": ("next", (0,))}
    assert len(control.jobs) == 32 and control.jobs["live"].finished  # all still listed

    successor = elected(url, 2)
    assert set(successor.jobs) == set(control.jobs)
    assert set(successor.live_jobs) == {"next"}
    assert successor.holdings() == {"t1": ("next", (0,))}
