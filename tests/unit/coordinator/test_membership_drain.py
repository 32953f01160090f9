"""Leases, expiry and drain decisions."""

from __future__ import annotations

import math

import pytest

from services.coordinator import drain
from services.coordinator.membership import Membership, NodeRecord, NodeState, Role, UnknownNode


def members(*ids: str, now: float = 0.0) -> Membership:
    m = Membership(lease_s=1.0)
    for node_id in ids:
        m.register(NodeRecord(node_id, Role.TRAINER, "x:1"), now)
    return m


@pytest.mark.parametrize(
    ("beats", "now", "dead"),
    [
        ({}, 0.99, []),
        ({}, 1.0, ["a", "b"]),  # the lease ends at exactly registered + lease
        ({"a": 0.5}, 1.2, ["b"]),
        ({"a": 0.5, "b": 0.9}, 1.49, []),
        ({"a": 0.5, "b": 0.9}, 1.9, ["a", "b"]),
    ],
)
def test_expire(beats, now, dead):
    m = members("a", "b", "c")
    for node_id, t in beats.items():
        m.heartbeat(node_id, t)
    m.heartbeat("c", now)  # the coordinator hears someone: the silence of a and b is theirs
    assert [n.node_id for n in m.expire(now)] == dead
    assert m.expire(now) == []  # declared once


@pytest.mark.parametrize(
    ("beats", "now", "silent"),
    [
        ({}, 0.39, []),
        ({}, 0.4, ["a", "b"]),  # silent from exactly last heard + after_s
        ({"a": 0.3}, 0.5, ["b"]),
        ({"a": 0.3, "b": 0.35}, 0.69, []),
    ],
)
def test_silent_nodes_are_those_not_heard_from_lately(beats, now, silent):
    m = members("a", "b")
    m.register(NodeRecord("ps", Role.PARAMSERVER, "x:2"), 0.0)  # other roles are not listed
    for node_id, t in beats.items():
        m.heartbeat(node_id, t)
    assert [n.node_id for n in m.silent(now, 0.4, Role.TRAINER)] == silent


def test_a_dead_node_is_not_silent():
    m = members("a")
    m.declare_dead("a")
    assert m.silent(5.0, 0.4, Role.TRAINER) == []


def test_dead_node_must_register_again():
    m = members("a")
    m.expire(5.0)
    with pytest.raises(UnknownNode):
        m.heartbeat("a", 5.1)
    with pytest.raises(UnknownNode):
        m.heartbeat("nobody", 5.1)
    m.register(NodeRecord("a", Role.TRAINER, "x:2"), 6.0)
    assert m.heartbeat("a", 6.5).state is NodeState.ALIVE


def test_refresh_all_after_leader_change():
    m = members("a", now=0.0)
    m.refresh_all(10.0)
    assert m.expire(10.5) == []


def test_step_time_ema():
    m = members("a")
    m.heartbeat("a", 0.1, step=1, step_time=1.0)
    m.heartbeat("a", 0.2, step=2, step_time=2.0)
    assert m.nodes["a"].step_time_ema == pytest.approx(1.3)
    assert m.nodes["a"].last_step == 2


@pytest.mark.parametrize("bad", [math.inf, math.nan, -1.0, 0.0, 1e9])
def test_an_implausible_step_time_is_not_believed(bad):
    m = members("a")
    m.heartbeat("a", 0.1, step=1, step_time=1.0)
    m.heartbeat("a", 0.2, step=2, step_time=bad)
    assert m.nodes["a"].step_time_ema == 1.0 and m.nodes["a"].last_step == 2


def test_the_step_time_resent_with_every_beat_counts_once_per_step():
    m = members("a")
    m.heartbeat("a", 0.1, step=1, step_time=1.0)
    for beat in range(5):  # a long step: the last step's time again, every beat
        m.heartbeat("a", 0.2 + beat, step=1, step_time=2.0)
    assert m.nodes["a"].step_time_ema == 1.0


@pytest.mark.parametrize(
    ("state", "decision"),
    [
        (NodeState.ALIVE, drain.DrainDecision.START),
        (NodeState.DRAINING, drain.DrainDecision.ALREADY),
        (NodeState.DRAINED, drain.DrainDecision.ALREADY),
        (NodeState.DEAD, drain.DrainDecision.REFUSE),
        (NodeState.QUARANTINED, drain.DrainDecision.REFUSE),
    ],
)
def test_decide_drain(state, decision):
    assert drain.decide_drain(state) is decision


@pytest.mark.parametrize(
    ("state", "decision"),
    [
        (NodeState.DRAINING, drain.UndrainDecision.RESUME),
        (NodeState.DRAINED, drain.UndrainDecision.RESUME),
        (NodeState.ALIVE, drain.UndrainDecision.ALREADY),
        (NodeState.DEAD, drain.UndrainDecision.REFUSE),
        (NodeState.QUARANTINED, drain.UndrainDecision.REFUSE),
    ],
)
def test_decide_undrain(state, decision):
    assert drain.decide_undrain(state) is decision


@pytest.mark.parametrize(
    ("state", "decision"),
    [
        (NodeState.QUARANTINED, drain.UndrainDecision.RESUME),
        (NodeState.DRAINED, drain.UndrainDecision.RESUME),
        (NodeState.ALIVE, drain.UndrainDecision.ALREADY),
        (NodeState.DEAD, drain.UndrainDecision.REFUSE),  # releasing cannot bring it back
    ],
)
def test_decide_undrain_releasing_a_quarantine(state, decision):
    assert drain.decide_undrain(state, release_quarantine=True) is decision


@pytest.mark.parametrize(
    ("state", "holds", "drained"),
    [
        (NodeState.DRAINING, False, True),
        (NodeState.DRAINING, True, False),
        (NodeState.ALIVE, False, False),
    ],
)
def test_is_drained(state, holds, drained):
    assert drain.is_drained(state, holds) is drained


@pytest.mark.parametrize(("score", "expected"), [(0.9, False), (0.3, True)])
def test_health_drain(score, expected):
    assert drain.should_drain_for_health(NodeState.ALIVE, score, 0.5) is expected


def test_a_quarantined_node_stays_quarantined_through_silence_and_restart():
    m = members("a", "b", "q")
    m.nodes["q"].state = NodeState.QUARANTINED
    m.heartbeat("a", 1.5)
    m.heartbeat("b", 1.5)  # the coordinator hears others: q's silence is q's
    assert [n.node_id for n in m.expire(1.6)] == []  # q's lease ended, but it is not DEAD
    assert m.declare_dead("q") is None  # nor when its port refuses
    assert [n.node_id for n in m.silent(1.6, 0.5, Role.TRAINER)] == []
    assert m.nodes["q"].state is NodeState.QUARANTINED
    assert m.forget_dead(100.0, 1.0, set) == []  # and never forgotten
    restarted = m.register(NodeRecord("q", Role.TRAINER, "x:2"), 2.0)
    assert restarted.state is NodeState.QUARANTINED
