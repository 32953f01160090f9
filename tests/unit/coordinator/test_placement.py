"""Slot placement and standby promotion, as decision tables."""

from __future__ import annotations

import pytest

from services.coordinator import placement
from services.coordinator.jobs import Cancelled
from services.coordinator.membership import NodeState
from services.coordinator.placement import (
    Assign,
    AttachStandby,
    DropStandby,
    MarkDrained,
    Release,
    Vacate,
)
from tests.unit.coordinator.builders import job, trainer

DEAD, DRAINING = NodeState.DEAD, NodeState.DRAINING


@pytest.mark.parametrize(
    ("slots", "running", "standbys", "nodes", "expected"),
    [
        # empty job, two free trainers: slot order follows node id (equal health/EMA)
        (
            ("", ""),
            False,
            (),
            [trainer("b"), trainer("a")],
            [Assign("j", 0, "a", False), Assign("j", 1, "b", False)],
        ),
        # healthier first, then faster (EMA), then node id
        (
            ("",),
            False,
            (),
            [trainer("a", health=0.5), trainer("b", ema=0.2), trainer("c", ema=0.1)],
            [Assign("j", 0, "c", False)],
        ),
        # too few trainers: the one there is computes every slot (elastic.py)
        (
            ("", "", ""),
            False,
            (),
            [trainer("a")],
            [
                Assign("j", 0, "a", False),
                Assign("j", 1, "a", False, beside=True),
                Assign("j", 2, "a", False, beside=True),
            ],
        ),
        # a dead holder is vacated and its warm standby promoted into the slot
        (
            ("a", "b"),
            True,
            ("s",),
            [trainer("a", DEAD), trainer("b"), trainer("s", standby=True)],
            [Vacate("j", 0, "a"), Assign("j", 0, "s", True)],
        ),
        # running job: its own standby before a free worker
        (
            ("a",),
            True,
            ("s",),
            [trainer("a", DEAD), trainer("w"), trainer("s", standby=True)],
            [Vacate("j", 0, "a"), Assign("j", 0, "s", True)],
        ),
        # pending job: a free worker before the standby
        (
            ("",),
            False,
            ("s",),
            [trainer("w"), trainer("s", standby=True)],
            [Assign("j", 0, "w", False)],
        ),
        # a draining holder gives its slot up; with no work left it is drained
        (
            ("a",),
            True,
            (),
            [trainer("a", DRAINING), trainer("w")],
            [Vacate("j", 0, "a"), Assign("j", 0, "w", False), MarkDrained("a")],
        ),
        # a dead standby is dropped
        (("a",), True, ("s",), [trainer("a"), trainer("s", DEAD)], [DropStandby("j", "s")]),
        # a free standby-registered trainer is attached to the job
        (("a",), True, (), [trainer("a"), trainer("s", standby=True)], [AttachStandby("j", "s")]),
        # nothing to do
        (("a",), True, (), [trainer("a")], []),
        # a slot whose trainer died with nobody to take it stays free
        (("a",), True, (), [trainer("a", DEAD)], [Vacate("j", 0, "a")]),
    ],
)
def test_decide(slots, running, standbys, nodes, expected):
    assert (
        placement.decide([job(slots=slots, running=running, standbys=standbys)], nodes) == expected
    )


def test_finished_job_releases_its_trainers():
    j = job(slots=("a",), running=True, standbys=("s",))
    j.status = Cancelled(1.0, "bye")
    actions = placement.decide([j], [trainer("a"), trainer("s", standby=True)])
    assert actions == [Release("j", "a"), Release("j", "s")]


def test_standbys_spread_over_jobs_oldest_first():
    jobs = [
        job("old", ("a",), running=True, created=0),
        job("new", ("b",), running=True, created=1),
    ]
    nodes = [trainer("a"), trainer("b"), trainer("s1", standby=True), trainer("s2", standby=True)]
    assert placement.decide(jobs, nodes) == [AttachStandby("old", "s1"), AttachStandby("new", "s2")]


def test_a_trainer_never_holds_slots_of_two_jobs():
    jobs = [job("x", ("",), created=0), job("y", ("",), created=1)]
    assert placement.decide(jobs, [trainer("a")]) == [Assign("x", 0, "a", False)]


def test_apply_moves_the_standby_into_the_slot():
    j = job(slots=("a",), running=True, standbys=("s",))
    actions = placement.decide([j], [trainer("a", DEAD), trainer("s", standby=True)])
    assert placement.apply({"j": j}, actions) == {"j"}
    assert [s.node_id for s in j.slots] == ["s"] and j.standbys == []
    assert placement.decide([j], [trainer("a", DEAD), trainer("s", standby=True)]) == []


def test_a_standby_given_a_free_slot_is_not_offered_an_extra_one_too():
    # slots 0 and 1 on "a", slot 2 free: the first standby takes the free slot and
    # the second the extra slot (the first used to be given both, the second idle)
    jobs = [job("x", ("a", "a", ""), running=True, standbys=("s1", "s2"), created=0),
            job("y", ("b",), running=True, created=1)]  # fmt: skip
    nodes = [trainer("a"), trainer("b"),
             trainer("s1", standby=True), trainer("s2", standby=True)]  # fmt: skip
    actions = placement.decide(jobs, nodes)
    assigned = [(a.slot, a.node_id) for a in actions if isinstance(a, Assign)]
    assert sorted(n for _, n in assigned) == ["s1", "s2"], actions
    assert not any(isinstance(a, AttachStandby) for a in actions)  # none left to attach
