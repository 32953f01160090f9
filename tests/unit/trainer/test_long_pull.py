"""A pull whose transfer outlasts the worker's poll interval is taken up again, not
started over: started over, a model that takes longer than ``poll_s`` to transfer was
never loaded (every try was cancelled at ``poll_s`` and began from its first byte)."""

from __future__ import annotations

import asyncio

from services.trainer.faults import Faults
from services.trainer.worker import JobState, Worker, _close_client
from stalwart.api import coordinator

POLL_S = 0.05
TRANSFER_S = 4 * POLL_S


def _worker_with_slow_pulls() -> tuple[Worker, list[int]]:
    worker = Worker("cpu", make_client=None, faults=Faults.parse(""), poll_s=POLL_S)
    worker.job = JobState("job-1", coordinator.JobSpec(num_slots=1), None, None, None, b"")
    started: list[int] = []

    async def transfer(job: JobState, min_version: int, timed: bool = True) -> bool:
        started.append(min_version)
        await asyncio.sleep(TRANSFER_S)  # the transfer itself
        job.version = min_version
        return True

    worker._pull_consistent = transfer
    return worker, started


def test_a_pull_longer_than_the_poll_interval_is_taken_up_again() -> None:
    worker, started = _worker_with_slow_pulls()

    async def as_the_loop_does() -> int:
        for tries in range(1, 41):  # each False: the loop comes back at once
            if await worker._pull(3):
                return tries
        return 0  # never loaded

    tries = asyncio.run(as_the_loop_does())
    assert started == [3]  # one transfer, however many waits it took
    assert tries > 1 and worker.job.version == 3


def test_a_pull_for_another_version_or_a_new_assignment_is_abandoned() -> None:
    worker, started = _worker_with_slow_pulls()

    async def scenario() -> None:
        assert not await worker._pull(3)
        first = worker.job.pull_under_way[1]
        assert not await worker._pull(4)  # another version: the first is dropped
        assert first.cancelled()
        worker.changed.set()  # the assignment moved: nothing is left under way
        assert not await worker._pull(4)
        assert worker.job.pull_under_way is None

    asyncio.run(scenario())
    assert started == [3, 4]  # the last call took up the pull for 4, then dropped it


def test_a_pull_under_way_is_abandoned_with_the_client_it_runs_on() -> None:
    # a new shard map (a promotion, a restore onto other replicas) replaces the client:
    # the pull left under way on the old one is not taken up by the next wait
    class _Client:
        closed = False

        async def close(self) -> None:
            self.closed = True

    async def as_a_new_shard_map_does() -> tuple[bool, bool, object]:
        job = JobState("job-1", coordinator.JobSpec(num_slots=1), None, None, None, b"")
        job.client = _Client()
        pull = asyncio.ensure_future(asyncio.sleep(3600))
        job.pull_under_way = (3, pull)
        await _close_client(job)
        return pull.cancelled(), job.client.closed, job.pull_under_way

    assert asyncio.run(as_a_new_shard_map_does()) == (True, True, None)
