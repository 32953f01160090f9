"""The job state machine and the leader state, as tables."""

from __future__ import annotations

import pytest

from services.coordinator import jobs
from services.coordinator.jobs import Cancel, Fail, JobState, Progress, SlotsChanged
from services.coordinator.leader import Elected, LeaderState, SteppedDown, parse_holder
from services.coordinator.settings import CoordinatorSettings
from tests.unit.coordinator.builders import job

P, R, S, F, C = (JobState.PENDING, JobState.RUNNING, JobState.SUCCEEDED, JobState.FAILED,
                 JobState.CANCELLED)  # fmt: skip


@pytest.mark.parametrize(
    ("slots", "running", "event", "new_state"),
    [
        (("a", ""), False, SlotsChanged(), None),  # a slot still free: stays PENDING
        (("a", "b"), False, SlotsChanged(), R),
        (("a", "b"), False, Progress(0), R),
        (("a", "b"), True, Progress(50), None),
        (("a", "b"), True, Progress(100), S),  # steps = 100
        (("a", ""), True, SlotsChanged(), None),  # lost a trainer: stays RUNNING
        (("a", "b"), True, Cancel("user"), C),
        (("", ""), False, Cancel("user"), C),
        (("a", "b"), True, Fail("no paramserver"), F),
    ],
)
def test_transitions(slots, running, event, new_state):
    j = job(slots=slots, running=running)
    change = jobs.advance(j, event, now=5.0)
    assert (change.new if change else None) is new_state
    if new_state is not None:
        assert j.state is new_state and j.updated_at == 5.0


@pytest.mark.parametrize("event", [Cancel("again"), Fail("x"), Progress(200), SlotsChanged()])
def test_terminal_states_absorb(event):
    j = job(slots=("a",), running=True)
    jobs.advance(j, Cancel("first"), 1.0)
    assert jobs.advance(j, event, 2.0) is None
    assert j.state is C and j.status.reason == "first"


def test_progress_moves_the_step_forward_only():
    j = job(slots=("a",), running=True)
    jobs.advance(j, Progress(7), 1.0)
    jobs.advance(j, Progress(3), 2.0)
    assert j.step == 7


def leader(ttl=1.0, margin=0.2) -> LeaderState:
    return LeaderState(ttl, margin)


def test_acts_only_before_the_lease_could_lapse():
    s = leader()
    assert s.acquired(3, "c1@h:1", started_at=10.0) == Elected(3)
    assert s.acting(10.79) and not s.acting(10.8)
    assert s.leader_address == "h:1" and s.epoch == 3


@pytest.mark.parametrize(
    ("ok", "started", "now", "stays"),
    [
        (True, 10.25, 10.3, True),
        (False, 10.25, 10.3, False),  # refused: someone else holds it
        (True, 10.25, 11.5, False),  # renewed after our own deadline (frozen process)
    ],
)
def test_renew(ok, started, now, stays):
    s = leader()
    s.acquired(1, "c1@h:1", 10.0)
    change = s.renewed(ok, started, now)
    assert (change is None) is stays
    assert s.acting(now) is stays
    if not stays:
        assert isinstance(change, SteppedDown)


def test_higher_epoch_deposes():
    s = leader()
    s.acquired(2, "c1@h:1", 0.0)
    assert s.saw_higher_epoch(2) is None
    assert isinstance(s.saw_higher_epoch(3), SteppedDown) and not s.acting(0.1)


@pytest.mark.parametrize(
    ("holder", "parsed"), [("n@h:1", ("n", "h:1")), ("", ("", "")), ("a@b@h:2", ("a@b", "h:2"))]
)
def test_parse_holder(holder, parsed):
    assert parse_holder(holder) == parsed


def test_the_default_lease_rides_out_a_starved_leader():
    """With the default settings a leader not scheduled for 2.5 s (a loaded machine,
    no fault) still acts when it wakes, where the former 1 s lease had lapsed at 0.8 s
    (docs/control-plane.md, "Why the leader lease is 3 s")."""
    settings = CoordinatorSettings()
    s = LeaderState(settings.leader_ttl_seconds, settings.leader_margin_seconds)
    s.acquired(1, "c1@h:1", started_at=100.0)
    assert s.renewed(True, started_at=100.25, now=102.7) is None  # late, still ours
    assert s.acting(100.25 + 2.5)
    assert not s.acting(100.25 + settings.leader_ttl_seconds - settings.leader_margin_seconds)
