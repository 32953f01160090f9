"""A step committed on some shard groups only, and an assignment that moves while the
worker waits (services/trainer/worker.py)."""

import asyncio

import pytest

from services.trainer.faults import Faults
from services.trainer.worker import JobState, Worker, _finishes_lagging_step, _slots_to_push
from stalwart.api import coordinator


def job(version: int, weights_version: int, num_slots: int = 2) -> JobState:
    spec = coordinator.JobSpec(num_slots=num_slots)
    state = JobState("job-1", spec, None, None, None, b"", version=version)
    state.weights_version = weights_version
    return state


def test_a_model_holding_the_lagging_version_starts_that_step_again():
    # after a promotion the shard map changed: version was reset, the weights were not
    held = job(version=-1, weights_version=20)
    assert _finishes_lagging_step(held, [21, 20])
    assert (held.version, held.next_version) == (20, 20)


@pytest.mark.parametrize("weights_version", [-1, 19, 21])
def test_a_model_holding_another_version_waits_for_the_groups(weights_version):
    other = job(version=-1, weights_version=weights_version)
    assert not _finishes_lagging_step(other, [21, 20])
    assert (other.version, other.next_version) == (-1, 0)


def test_three_groups_the_lowest_is_the_base():
    held = job(version=-1, weights_version=7)
    assert _finishes_lagging_step(held, [8, 7, 8])
    assert held.version == 7


def test_a_lagging_step_is_pushed_for_every_slot_once():
    """Its own slots first; the others' trainers may hold no weights of that base."""
    held = job(version=-1, weights_version=20, num_slots=4)
    assert _finishes_lagging_step(held, [21, 20])
    assert _slots_to_push(held, (2,), 20) == (2, 0, 1, 3)
    assert _slots_to_push(held, (2,), 20) == (2,)  # the next attempt: its own again
    assert _slots_to_push(held, (1, 3), 21) == (1, 3)


def test_an_ordinary_step_pushes_the_slots_held():
    other = job(version=5, weights_version=5, num_slots=3)
    assert _slots_to_push(other, (0, 2), 5) == (0, 2)


async def _never() -> None:
    await asyncio.sleep(3600)


def test_work_that_outlasts_its_assignment_is_abandoned():
    # a registration retrying against a lost group's dead primary: the restore that
    # moves the group changes the assignment, and the worker must follow it at once
    worker = Worker("cpu", make_client=None, faults=Faults.parse(""))

    async def scenario():
        work = asyncio.ensure_future(_never())
        waiting = asyncio.ensure_future(worker._unless_changed(work))
        await asyncio.sleep(0)
        assert not waiting.done()
        worker.changed.set()
        return await waiting, work

    finished, work = asyncio.run(scenario())
    assert finished is False and work.cancelled()


def test_work_that_ends_first_is_reported_done_and_its_error_raised():
    worker = Worker("cpu", make_client=None, faults=Faults.parse(""))
    assert asyncio.run(worker._unless_changed(asyncio.sleep(0))) is True

    async def fails():
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"):
        asyncio.run(worker._unless_changed(fails()))
