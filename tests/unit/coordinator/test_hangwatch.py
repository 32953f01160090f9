"""Which trainers the leader drains as hung (hangwatch.py): the holders of the slots a
synchronous step still waits for, once it has stood still past the limit, and only
when another trainer could take their slots."""

from __future__ import annotations

import pytest

from services.coordinator.hangwatch import Hung, StillSince, hung_holders, limit_s, stuck_shards

HOLDERS = {0: "tr0", 1: "tr1", 2: "tr2"}


def test_the_holder_of_the_missing_slot_is_hung_once_the_limit_passes() -> None:
    assert hung_holders("j", 12, 59.9, 60, HOLDERS, {0, 2}, others=2) == []
    (hung,) = hung_holders("j", 12, 60.0, 60, HOLDERS, {0, 2}, others=2)
    assert hung == Hung("tr1", "j", 12, (1,), 60.0)
    assert hung.reason == "hung: no push for slot 1 of j at step 12 in 60s"


def test_a_trainer_computing_several_slots_is_named_once() -> None:
    holders = {0: "tr0", 1: "tr1", 2: "tr1", 3: "tr2"}
    (hung,) = hung_holders("j", 3, 90, 60, holders, {0, 3}, others=1)
    assert (hung.node_id, hung.slots) == ("tr1", (1, 2))
    assert "slots 1, 2 of j" in hung.reason


def test_every_holder_waited_for_is_named() -> None:
    got = hung_holders("j", 3, 90, 60, HOLDERS, set(), others=1)  # a standby is left
    assert [h.node_id for h in got] == ["tr0", "tr1", "tr2"]


@pytest.mark.parametrize(
    ("pushed", "others", "limit"),
    [
        ({0, 1, 2}, 1, 60),  # every slot pushed: the commit is the paramserver's
        ({0, 2}, 0, 60),  # nobody could take slot 1: draining would stop the job for good
        ({0, 2}, 1, 0),  # turned off
    ],
)
def test_nothing_is_drained(pushed, others, limit) -> None:
    assert hung_holders("j", 12, 1e6, limit, HOLDERS, pushed, others) == []


def test_an_unassigned_slot_blames_nobody() -> None:
    assert hung_holders("j", 4, 100, 60, {0: "tr0"}, {0}, others=1) == []


def test_the_limit_grows_with_a_slow_jobs_steps() -> None:
    assert limit_s(300, 0.05) == 300  # a fast job: the setting
    assert limit_s(300, 45.0) == 450  # 45 s steps: ten of them
    assert limit_s(0, 45.0) == 0  # off stays off


def test_still_since_restarts_when_the_step_or_the_holders_change() -> None:
    still = StillSince()
    assert still.observe("j", (5, ("tr0", "tr1")), 100.0) == 0
    assert still.observe("j", (5, ("tr0", "tr1")), 130.0) == 30
    assert still.observe("j", (5, ("tr0", "sb")), 131.0) == 0  # a standby took a slot
    assert still.observe("j", (5, ("tr0", "sb")), 140.0) == 9
    assert still.observe("j", (6, ("tr0", "sb")), 141.0) == 0  # the step moved
    assert still.observe("j", (6, ("tr0", "sb"), ("ps-p", 1)), 150.0) == 0
    assert still.observe("j", (6, ("tr0", "sb"), ("ps-p", 1)), 170.0) == 20
    assert still.observe("j", (6, ("tr0", "sb"), ("ps-b", 2)), 171.0) == 0  # failed over
    still.keep_only([])
    assert still.observe("j", (6, ("tr0", "sb")), 500.0) == 0  # forgotten: a fresh start


def test_a_primary_holding_every_push_without_committing_is_wedged() -> None:
    by_shard = {0: {0, 1, 2}, 1: {0, 2}}  # shard 1 still waits for slot 1's push
    assert stuck_shards(59, 60, 3, by_shard) == []
    assert stuck_shards(60, 60, 3, by_shard) == [0]
    assert stuck_shards(1e6, 0, 3, by_shard) == []  # turned off
