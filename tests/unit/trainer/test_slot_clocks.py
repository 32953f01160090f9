"""An async or SSP slot's step is learnt again when the slot comes back to a trainer."""

from __future__ import annotations

from services.trainer.worker import JobState
from stalwart.api import coordinator


def test_the_clocks_of_slots_no_longer_held_are_forgotten() -> None:
    job = JobState("job-1", coordinator.JobSpec(num_slots=3), None, None, None, b"")
    job.clocks = {0: 7, 1: 5, 2: 9}
    job.keep_clocks_of((0, 2))  # slot 1 moved to another trainer
    assert job.clocks == {0: 7, 2: 9}
    job.keep_clocks_of((0, 1, 2))  # back: its step is asked again (the probe push)
    assert 1 not in job.clocks and job.clocks == {0: 7, 2: 9}
