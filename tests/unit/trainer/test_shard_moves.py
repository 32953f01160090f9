"""A step committed on some shard groups only, and an assignment that moves while the
worker waits (services/trainer/worker.py)."""

import asyncio

import pytest
import structlog.testing

from services.trainer.faults import Faults
from services.trainer.worker import (
    JobState,
    Worker,
    _finishes_lagging_step,
    _followed_by_old_client,
    _slots_to_push,
)
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


def _map(*groups: tuple[str, list[str]]) -> coordinator.GetShardMapResponse:
    return coordinator.GetShardMapResponse(groups=[
        coordinator.ShardGroup(shard=i, primary_address=p, backup_addresses=b, epoch=1)
        for i, (p, b) in enumerate(groups)
    ])  # fmt: skip


def _assignment(primary: str, backups: tuple[str, ...] = ()) -> coordinator.Assignment:
    shard_map = _map((primary, list(backups)))
    return coordinator.Assignment(job_id="job-1", slots=[0], shard_map=shard_map)


def _bytes(shard_map: coordinator.GetShardMapResponse) -> bytes:
    return shard_map.SerializeToString(deterministic=True)


def test_a_promoted_backup_is_followed_by_the_old_client():
    old = _map(("ps-a:1", ["ps-b:1"]))
    assert _followed_by_old_client(_bytes(old), _map(("ps-b:1", [])))
    assert _followed_by_old_client(_bytes(old), _map(("ps-b:1", ["ps-c:1"])))


@pytest.mark.parametrize(
    "new",
    [
        _map(("ps-c:1", ["ps-b:1"])),  # restored elsewhere: the old client cannot find it
        _map(("", ["ps-b:1"])),  # no primary yet
        _map(("ps-b:1", []), ("ps-d:1", [])),  # spread over two groups
    ],
)
def test_other_moves_are_not_followed(new):
    assert not _followed_by_old_client(_bytes(_map(("ps-a:1", ["ps-b:1"]))), new)


def test_a_sharded_job_never_follows_with_its_old_client():
    # a step may have committed on some groups only: every trainer starts over
    old = _map(("ps-a:1", ["ps-b:1"]), ("ps-d:1", ["ps-e:1"]))
    new = _map(("ps-b:1", []), ("ps-d:1", ["ps-e:1"]))
    assert not _followed_by_old_client(_bytes(old), new)


def test_pushes_to_a_moved_group_are_abandoned_when_the_map_arrives(monkeypatch):
    """Not at the next periodic check: a paramserver failover's recovery waited for it."""
    monkeypatch.setattr("services.trainer.worker.PUSH_CHECK_S", 3600.0)
    worker = Worker("cpu", make_client=None, faults=Faults.parse(""))
    old = _assignment("127.0.0.1:1001")
    worker.assign(old)
    worker.changed.clear()  # the step began under the old map
    state = job(version=4, weights_version=4, num_slots=1)
    state.shard_map = old.shard_map.SerializeToString(deterministic=True)

    async def scenario():
        push = asyncio.ensure_future(_never())  # to a primary that died
        waiting = asyncio.ensure_future(worker._answered(state, (0,), {0: push}, step=4))
        await asyncio.sleep(0)
        assert not waiting.done()
        worker.assign(_assignment("127.0.0.1:1002"))  # its backup, promoted
        pushed = await asyncio.wait_for(waiting, 60)  # a guard: not a timing
        push.cancel()
        return pushed

    assert asyncio.run(scenario()) is False


def test_an_assignment_that_moves_nothing_leaves_the_pushes_waiting(monkeypatch):
    monkeypatch.setattr("services.trainer.worker.PUSH_CHECK_S", 0.01)
    worker = Worker("cpu", make_client=None, faults=Faults.parse(""))
    same = _assignment("127.0.0.1:1001")
    worker.assign(same)
    state = job(version=4, weights_version=4, num_slots=1)
    state.shard_map = same.shard_map.SerializeToString(deterministic=True)

    async def scenario():
        answer = asyncio.get_running_loop().create_future()
        waiting = asyncio.ensure_future(worker._answered(state, (0,), {0: answer}, step=4))
        for _ in range(5):  # the change event stays set: the checks alone pace the wait
            await asyncio.sleep(0.02)
        assert not waiting.done()
        answer.set_result(None)
        return await asyncio.wait_for(waiting, 60)

    assert asyncio.run(scenario()) is True


def test_pushes_on_their_way_to_a_promoted_backup_go_on(monkeypatch):
    monkeypatch.setattr("services.trainer.worker.PUSH_CHECK_S", 0.01)
    worker = Worker("cpu", make_client=None, faults=Faults.parse(""))
    old = _assignment("127.0.0.1:1001", backups=("127.0.0.1:1002",))
    worker.assign(old)
    state = job(version=4, weights_version=4, num_slots=1)
    state.shard_map = _bytes(old.shard_map)
    state.client = _Following()

    async def scenario():
        answer = asyncio.get_running_loop().create_future()
        waiting = asyncio.ensure_future(worker._answered(state, (0,), {0: answer}, step=4))
        await asyncio.sleep(0)
        worker.assign(_assignment("127.0.0.1:1002"))  # the backup, promoted
        for _ in range(5):
            await asyncio.sleep(0.02)
        assert not waiting.done()
        answer.set_result(None)  # sent on to it, and it committed
        return await asyncio.wait_for(waiting, 60)

    assert asyncio.run(scenario()) is True
    # the client was told where the primary is now: a stopped old primary never
    # refuses the calls under way, which would otherwise wait out their deadline
    assert state.client.followed[0] == [("127.0.0.1:1002", 1)]


class _Following:
    """A job's client that records the shard maps it is told to follow."""

    def __init__(self) -> None:
        self.followed: list[list[tuple[str, int]]] = []

    def follow(self, groups) -> None:
        self.followed.append([(g.primary_address, g.epoch) for g in groups])

    def primaries(self) -> list[str]:
        return ["127.0.0.1:1001"]


def test_a_step_waiting_long_on_its_pushes_is_logged_once_with_the_primaries(monkeypatch):
    monkeypatch.setattr("services.trainer.worker.PUSH_CHECK_S", 0.01)
    monkeypatch.setattr("services.trainer.worker.SLOW_PUSH_LOG_S", 0.0)
    worker = Worker("cpu", make_client=None, faults=Faults.parse(""))
    same = _assignment("127.0.0.1:1001")
    worker.assign(same)
    state = job(version=4, weights_version=4, num_slots=2)
    state.shard_map = _bytes(same.shard_map)
    state.client = _Following()

    async def scenario():
        loop = asyncio.get_running_loop()
        answered, waiting_on = loop.create_future(), loop.create_future()
        answered.set_result(None)
        waiting = asyncio.ensure_future(
            worker._answered(state, (0, 1), {0: answered, 1: waiting_on}, step=4)
        )
        for _ in range(5):
            await asyncio.sleep(0.02)
        waiting_on.set_result(None)
        return await asyncio.wait_for(waiting, 60)

    with structlog.testing.capture_logs() as logs:
        assert asyncio.run(scenario()) is True
    slow = [e for e in logs if e["event"] == "step waiting on its pushes"]
    assert len(slow) == 1
    assert (slow[0]["step"], slow[0]["slots"], slow[0]["primaries"]) == (4, [1], ["127.0.0.1:1001"])
