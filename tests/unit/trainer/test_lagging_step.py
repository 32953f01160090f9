"""A step committed on some shard groups only (services/trainer/worker.py)."""

import pytest

from services.trainer.worker import JobState, _finishes_lagging_step


def job(version: int, weights_version: int) -> JobState:
    state = JobState("job-1", None, None, None, None, b"", version=version)
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
