"""The chaos schedules are reproducible and stay within what the cluster must survive."""

from __future__ import annotations

import pytest

from tests.chaos.schedule import (
    PAIR_WITHIN_S,
    RESTARTS,
    ROLES,
    SERVICE_OF,
    STOP_RANGE_S,
    WINDOW,
    parse_seeds,
    schedule,
)


def test_a_seed_gives_the_same_schedule_and_seeds_differ() -> None:
    assert schedule(3, 120) == schedule(3, 120)
    assert len({tuple(schedule(s, 120)) for s in range(20)}) == 20


def _all(faults):
    for f in faults:
        yield f
        if f.then is not None:
            yield f.then


def test_faults_fall_in_the_window_in_order_with_bounded_pauses() -> None:
    for seed in range(200):
        faults = schedule(seed, 120)
        steps = [f.at_step for f in faults]
        assert steps == sorted(steps)
        assert all(120 * WINDOW[0] <= s <= 120 * WINDOW[1] for s in steps)
        for f in _all(faults):
            assert f.role in ROLES and f.action in ("kill", "stop")
            if f.action == "stop":
                assert STOP_RANGE_S[0] <= f.stop_s <= STOP_RANGE_S[1]
            else:
                assert f.stop_s == 0


def test_a_pair_never_hits_two_replicas_of_one_service() -> None:
    pairs = [f for s in range(200) for f in schedule(s, 120) if f.then is not None]
    assert pairs, "200 seeds drew no pair"
    for f in pairs:
        assert SERVICE_OF[f.role] != SERVICE_OF[f.then.role]
        assert 0 <= f.delay_s <= PAIR_WITHIN_S
        assert f.then.then is None and not f.then.kill_stand_in


def test_every_role_and_action_is_drawn_over_fifty_seeds() -> None:
    drawn = {(f.role, f.action) for s in range(50) for f in _all(schedule(s, 120))}
    assert drawn == {(r, a) for r in ROLES for a in ("kill", "stop")}


def test_restart_schedules_restart_every_role_and_leave_the_others_as_they_were() -> None:
    drawn = [f for s in range(50) for first in schedule(s, 200, actions=RESTARTS)
             for f in (first, first.then) if f is not None]  # fmt: skip
    assert {f.action for f in drawn} == {"restart"}
    assert {f.role for f in drawn} == set(ROLES)
    assert not any(f.kill_stand_in or f.stop_s for f in drawn)  # nothing else comes back
    # the kill / stop schedules are what they were before restart schedules existed
    assert [f.describe() for f in schedule(0, 200)] == [
        "step 62: stop follower 2.2s",
        "step 99: stop follower 7.8s",
        "step 157: kill standby",
    ]


def test_seed_ranges() -> None:
    assert parse_seeds("0-2,7") == [0, 1, 2, 7]
    assert parse_seeds("5") == [5]
    for bad in ("a", "3-1", "1-x"):
        with pytest.raises(ValueError, match="bad seed range"):
            parse_seeds(bad)
