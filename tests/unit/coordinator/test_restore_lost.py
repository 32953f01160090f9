"""Every job of a lost shard group is restored, however the others' restores went.

The group stays lost until each of its jobs is restored (or can never be: committed
steps and no verified checkpoint fail it; a job that committed nothing needs no
restore). Before, the first job restored cleared the group, so a second whose
restore failed once was never tried again and stood still; and a job without a
checkpoint listed first held back every job after it, round after round."""

from __future__ import annotations

import asyncio

from services.coordinator.checkpoints import Checkpoints, NoVerifiedCheckpoint
from services.coordinator.settings import CoordinatorSettings
from stalwart.api import coordinator
from stalwart.errors import ErrorKind, StalwartError
from tests.unit.coordinator.leaders import elected


def test_each_job_is_restored_once_and_the_group_is_lost_until_then(tmp_path) -> None:
    url = f"shm://{tmp_path}/state"
    control = elected(url, 1)
    settings = CoordinatorSettings(store_url=url, checkpoint_url=f"shm://{tmp_path}/ckpt")
    checkpoints = Checkpoints(control, lambda address: None, lambda shard: [], settings)
    spec = coordinator.JobSpec(model="mlp", num_slots=1, steps=100, batch_size=1)
    for job_id, step in (("a", 5), ("b", 5), ("c", 0), ("d", 7)):
        asyncio.run(control.create_job(job_id, spec, ""))
        control.jobs[job_id].step = step
    control.lost_groups.add(0)
    asked: list[str] = []
    b_failures = [StalwartError(ErrorKind.UNAVAILABLE, "LoadCheckpoint timed out")]

    async def restore(job_id, checkpoint_id, why, clear_lost=True):
        asked.append(job_id)
        assert not clear_lost
        if job_id == "b" and b_failures:
            raise b_failures.pop()
        if job_id in ("c", "d"):
            raise NoVerifiedCheckpoint(ErrorKind.FAILED_PRECONDITION,
                                       f"job {job_id} has no verified checkpoint")  # fmt: skip
        return control.jobs[job_id]

    checkpoints.restore = restore
    asyncio.run(checkpoints._restore_lost([0]))
    assert asked == ["a", "b", "c", "d"]
    assert control.lost_groups == {0}  # b is still to restore
    assert control.jobs["d"].state.value == "failed"  # its steps existed on the group only
    assert control.jobs["c"].state.value == "pending"  # nothing to restore: it starts afresh

    asked.clear()
    asyncio.run(checkpoints._restore_lost([0]))
    assert asked == ["b", "c"]  # a is not rewound again
    assert control.lost_groups == set()
    assert elected(url, 2).lost_groups == set()
