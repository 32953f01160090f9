"""Elastic slots: spilling free slots onto a job's own trainers and spreading them
out again, as decision tables (pure rules, then through placement.decide)."""

from __future__ import annotations

import pytest

from services.coordinator import elastic, placement
from services.coordinator.membership import NodeState
from services.coordinator.placement import Assign, AttachStandby, Vacate
from tests.unit.coordinator.builders import job, trainer

DEAD = NodeState.DEAD


@pytest.mark.parametrize(
    ("holders", "rank", "expected"),
    [
        ({0: "a", 1: "", 2: ""}, (), [(1, "a"), (2, "a")]),
        # the least loaded holder first; ties by rank, then node id
        ({0: "a", 1: "a", 2: "b", 3: ""}, (), [(3, "b")]),
        ({0: "a", 1: "b", 2: "", 3: ""}, ("b", "a"), [(2, "b"), (3, "a")]),
        ({0: "a", 1: "b", 2: "", 3: ""}, (), [(2, "a"), (3, "b")]),
        # nobody holds a slot: nothing to spill onto (the job waits for a trainer)
        ({0: "", 1: ""}, (), []),
        ({0: "a", 1: "b"}, (), []),
    ],
)
def test_spill(holders, rank, expected):
    assert elastic.spill(holders, rank) == expected


@pytest.mark.parametrize(
    ("holders", "rank", "expected"),
    [
        ({0: "a", 1: "a", 2: "a"}, (), [2, 1]),
        # the most loaded gives first, its highest slot; a holder keeps one slot
        ({0: "a", 1: "a", 2: "a", 3: "b", 4: "b"}, (), [2, 4, 1]),
        # equal loads: the worse-ranked holder gives first
        ({0: "a", 1: "a", 2: "b", 3: "b"}, ("b", "a"), [1, 3]),
        ({0: "a", 1: "b", 2: ""}, (), []),
    ],
)
def test_extras(holders, rank, expected):
    assert elastic.extras(holders, rank) == expected


def test_load_lists_each_holders_slots_ascending():
    assert elastic.load({2: "a", 0: "a", 1: "b", 3: ""}) == {"a": [0, 2], "b": [1]}


def test_two_of_three_trainers_die_the_survivor_takes_their_slots():
    j = job(slots=("a", "b", "c"), running=True)
    nodes = [trainer("a", DEAD), trainer("b"), trainer("c", DEAD)]
    assert placement.decide([j], nodes) == [
        Vacate("j", 0, "a"),
        Vacate("j", 2, "c"),
        Assign("j", 0, "b", False, beside=True),
        Assign("j", 2, "b", False, beside=True),
    ]


def test_joining_trainers_take_the_extra_slots_and_nothing_more_happens():
    j = job(slots=("b", "b", "b"), running=True)
    nodes = [trainer("b"), trainer("d"), trainer("e")]
    actions = placement.decide([j], nodes)
    assert actions == [Assign("j", 2, "d", False), Assign("j", 1, "e", False)]
    placement.apply({"j": j}, actions)
    assert [s.node_id for s in j.slots] == ["b", "e", "d"]
    assert placement.decide([j], nodes) == []  # stable once spread


def test_a_joining_trainer_serves_a_waiting_job_before_another_jobs_extra_slot():
    jobs = [job("old", ("a", "a"), running=True, created=0), job("new", ("",), created=1)]
    assert placement.decide(jobs, [trainer("a"), trainer("w")]) == [Assign("new", 0, "w", False)]


def test_a_joining_standby_takes_an_extra_slot_as_it_would_a_free_one():
    j = job(slots=("a", "a"), running=True)
    nodes = [trainer("a"), trainer("s", standby=True)]
    assert placement.decide([j], nodes) == [Assign("j", 1, "s", False)]


def test_the_jobs_own_standby_is_promoted_into_an_extra_slot():
    j = job(slots=("a", "a"), running=True, standbys=("s",))
    nodes = [trainer("a"), trainer("s", standby=True)]
    assert placement.decide([j], nodes) == [Assign("j", 1, "s", True)]


def test_spread_after_a_kill_and_rejoin_gives_every_trainer_one_slot():
    j = job(slots=("a", "b", "c"), running=True)
    for nodes in (
        [trainer("a", DEAD), trainer("b"), trainer("c", DEAD)],
        [trainer("b"), trainer("d"), trainer("e")],
    ):
        placement.apply({"j": j}, placement.decide([j], nodes))
    assert sorted(s.node_id for s in j.slots) == ["b", "d", "e"]


def test_own_standby_stays_a_standby_while_no_slot_is_extra():
    j = job(slots=("a", "b"), running=True)
    nodes = [trainer("a"), trainer("b"), trainer("s", standby=True)]
    assert placement.decide([j], nodes) == [AttachStandby("j", "s")]
