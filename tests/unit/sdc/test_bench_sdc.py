"""The sdc bench library on a tiny mlp: every mode measured in one run, checks counted."""

from __future__ import annotations

import pytest

from stalwart.bench import sdc

pytestmark = pytest.mark.timeout(120)


def test_bench_sdc_measures_every_mode_in_one_run():
    result = sdc.main(steps=3, rounds=2, dup_every=3, hidden=64, batch_size=8)
    assert set(result["steps_per_second"]) == {"off", "abft", "abft_forward", "dup"}
    assert all(v > 0 for v in result["steps_per_second"].values())
    # 5 linear layers (4 hidden, 1 out), forward and weight-gradient checks, 3 steps x 2 rounds
    assert result["abft_checks"] == 5 * 2 * 3 * 2
    assert result["duplicate_compute_rate"] == "1/3"
    # two rounds of tiny steps cannot tell a 5 % overhead from noise: no verdict
    assert result["abft_goal_met"] is None
    assert "2 rounds" in result["too_short_to_judge"]


def test_the_abft_goal_is_judged_only_from_enough_rounds_and_time():
    """`--steps 1 --rounds 1` printed a goal verdict from one 30 ms step a mode."""
    assert sdc.goal_verdict(0.01, [0.03]) == {
        "abft_goal_met": None,
        "too_short_to_judge": "1 round, 0.03s of plain steps: the goal is judged from at "
        "least 5 rounds and 1s; give more --steps or --rounds",
    }
    assert sdc.goal_verdict(0.01, [0.1] * 9)["abft_goal_met"] is None  # 0.9 s of steps
    assert sdc.goal_verdict(0.01, [0.3] * 5) == {"abft_goal_met": True}
    assert sdc.goal_verdict(0.08, [0.3] * 12) == {"abft_goal_met": False}
