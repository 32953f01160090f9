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
    assert result["abft_goal_met"] == (result["abft_overhead"] <= 0.05)
