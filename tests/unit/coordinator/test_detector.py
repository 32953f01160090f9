"""The accrual failure detector and the membership that uses it: slow is not dead."""

from __future__ import annotations

import math
import random

import pytest

from services.coordinator.detector import ArrivalWindow, DetectorConfig
from services.coordinator.membership import Membership, NodeRecord, NodeState, Role
from services.coordinator.settings import CoordinatorSettings

DEFAULTS = CoordinatorSettings().detector()


def _beats(window: ArrivalWindow, start: float, intervals) -> float:
    now = start
    for dt in intervals:
        now += dt
        window.heartbeat(now)
    return now


def test_default_window_is_above_the_floor_and_one_in_ten_to_the_eight():
    w = ArrivalWindow(DEFAULTS, 0.0)
    _beats(w, 0.0, [0.2] * 200)
    # phi = 8 at t = 8 ln(10) * 0.2 s = 3.68 s: above the 3 s floor
    assert w.window_s() == pytest.approx(8 * math.log(10) * 0.2)
    assert w.window_s() >= DEFAULTS.floor_s


def test_phi_grows_with_silence():
    w = ArrivalWindow(DEFAULTS, 0.0)
    last = _beats(w, 0.0, [0.2] * 50)
    assert w.phi(last) == 0
    assert w.phi(last + 0.2) == pytest.approx(1 / math.log(10), rel=1e-6)
    assert w.phi(last + 2) < w.phi(last + 3) < DEFAULTS.threshold <= w.phi(last + 3.7)


def test_a_loaded_machine_widens_the_window():
    """Beats 0.2 s apart on paper, 0.5-1.5 s apart on a starved machine: such a node
    is never declared dead between its beats, and its window grows past the floor."""
    rng = random.Random(7)
    w = ArrivalWindow(DEFAULTS, 0.0)
    now = 0.0
    for _ in range(300):
        gap = rng.uniform(0.5, 1.5)
        assert not w.dead(now + gap), f"declared dead after a {gap:.2f} s gap"
        now += gap
        w.heartbeat(now)
    assert w.window_s() > 10


def test_floor_and_ceiling_clamp_the_window():
    config = DetectorConfig(interval_s=0.01, floor_s=3.0, ceiling_s=30.0)
    fast = ArrivalWindow(config, 0.0)
    _beats(fast, 0.0, [0.01] * 100)
    assert fast.window_s() == 3.0  # fast beats cannot make death hair-trigger
    slow = ArrivalWindow(config, 0.0)
    _beats(slow, 0.0, [20.0] * 100)
    assert slow.window_s() == 30.0


def test_a_stopped_node_is_dead_once_its_window_passes():
    w = ArrivalWindow(DEFAULTS, 0.0)
    last = _beats(w, 0.0, [0.2] * 100)
    assert not w.dead(last + 3.5)
    assert w.dead(last + 3.7)


def test_the_assumed_interval_counts_as_a_sample():
    w = ArrivalWindow(DEFAULTS, 0.0)
    _beats(w, 0.0, [0.001] * 3)  # a burst of retried beats
    assert w.mean() > 0.04


def test_repeated_or_backwards_arrivals_teach_nothing():
    w = ArrivalWindow(DEFAULTS, 10.0)
    w.heartbeat(10.0)
    w.heartbeat(9.0)
    assert w.mean() == DEFAULTS.interval_s and w.last == 10.0


# --- membership ----------------------------------------------------------------------


def _members() -> Membership:
    return Membership(DEFAULTS.floor_s, DEFAULTS)


def test_a_new_leader_gives_every_node_a_full_window():
    m = _members()
    m.register(NodeRecord("t1", Role.TRAINER, "a:1"), 0.0)
    for i in range(1, 50):
        m.heartbeat("t1", i * 0.2)
    # a leader change at t=100: the node was silent for 90 s by the old history
    m.refresh_all(100.0)
    assert m.expire(100.0 + DEFAULTS.floor_s - 0.01) == []
    assert [n.node_id for n in m.expire(100.0 + DEFAULTS.ceiling_s)] == ["t1"]


def test_membership_declares_dead_by_the_detector_not_a_fixed_lease():
    m = _members()
    m.register(NodeRecord("t1", Role.TRAINER, "a:1"), 0.0)
    m.register(NodeRecord("t2", Role.TRAINER, "a:2"), 0.0)
    now = 0.0
    for _ in range(30):  # t1 beats every 0.2 s, t2 every 1.5 s (a starved process)
        now += 1.5
        for k in range(1, 8):
            m.heartbeat("t1", now - 1.5 + k * 0.2)
        m.heartbeat("t2", now)
    assert m.expire(now + 1.4) == []
    assert m.window_s("t2") > m.window_s("t1")
    m.heartbeat("t2", now + 1.5)
    m.heartbeat("t2", now + 3.0)
    died = m.expire(now + 4.0)
    assert [n.node_id for n in died] == ["t1"]  # silent 4 s at 0.2 s intervals
    assert m.nodes["t2"].state is NodeState.ALIVE


def _beating(m: Membership, ids: list[str], until: float, start: float = 0.0) -> None:
    t = start
    while t < until:
        t += 0.2
        for node_id in ids:
            m.heartbeat(node_id, t)


def test_a_coordinator_that_hears_nobody_declares_nobody_dead():
    m = _members()
    for node_id, role in (("t1", Role.TRAINER), ("t2", Role.TRAINER), ("p1", Role.PARAMSERVER)):
        m.register(NodeRecord(node_id, role, f"{node_id}:1"), 0.0)
    _beating(m, ["t1", "t2", "p1"], 10.0)
    # its link is cut: every node falls silent at once, for longer than any window
    assert m.hears_nobody(10.0 + DEFAULTS.ceiling_s)
    assert m.expire(10.0 + DEFAULTS.ceiling_s) == []
    # heard again: every node gets a fresh window, nobody is dead
    m.heartbeat("t1", 50.0)
    assert m.expire(50.0) == []
    assert all(n.state is NodeState.ALIVE for n in m.nodes.values())
    # t1 goes on beating, t2 and p1 stay silent: now their silence is their own
    _beating(m, ["t1"], 50.0 + DEFAULTS.floor_s + 1.0, start=50.0)
    died = m.expire(50.0 + DEFAULTS.floor_s + 1.0)
    assert [n.node_id for n in died] == ["p1", "t2"]
    assert m.nodes["t1"].state is NodeState.ALIVE


def test_one_silent_node_among_beating_ones_and_a_lone_node_are_declared_dead():
    m = _members()
    m.register(NodeRecord("t1", Role.TRAINER, "t1:1"), 0.0)
    assert not m.hears_nobody(DEFAULTS.ceiling_s)  # one node: its silence is its own
    assert [n.node_id for n in m.expire(DEFAULTS.ceiling_s)] == ["t1"]


def test_silent_counts_from_the_last_beat():
    m = _members()
    m.register(NodeRecord("t1", Role.TRAINER, "a:1"), 0.0)
    m.heartbeat("t1", 1.0)
    assert m.silent(1.3, 0.4, Role.TRAINER) == []
    assert [n.node_id for n in m.silent(1.5, 0.4, Role.TRAINER)] == ["t1"]


def test_fixed_lease_without_a_detector():
    m = Membership(lease_s=1.0)
    m.register(NodeRecord("t1", Role.TRAINER, "a:1"), 0.0)
    assert m.expire(0.99) == []
    assert [n.node_id for n in m.expire(1.0)] == ["t1"]


def test_a_floor_above_the_ceiling_raises_the_ceiling():
    config = CoordinatorSettings(node_lease_seconds=60.0, node_dead_max_seconds=30.0).detector()
    assert config.floor_s == config.ceiling_s == 60.0
