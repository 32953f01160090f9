"""`job submit --wait --wait-timeout`: a job still running at the deadline is one error
line (exit 1), printed after the progress bar is closed, not in the middle of it."""

import asyncio

import pytest
import typer

from stalwart.api import coordinator
from stalwart.cli.jobs import wait_for


class Running:
    def __init__(self, job: coordinator.Job):
        self.job, self.calls = job, 0

    async def get_job(self, job_id: str) -> coordinator.Job:
        self.calls += 1
        self.job.step += 1
        return self.job


def test_a_job_still_running_at_the_deadline_is_one_error_line(capsys):
    job = coordinator.Job(job_id="j", state=coordinator.JOB_STATE_RUNNING,
                          spec=coordinator.JobSpec(steps=100))  # fmt: skip
    client = Running(job)
    with pytest.raises(typer.Exit) as done:
        asyncio.run(wait_for(client, job, timeout_s=0.6, show=False))
    assert done.value.exit_code == 1 and client.calls >= 1
    assert capsys.readouterr().err == (
        f"Error: job j still running at step {client.calls} after 1s\n"
    )


def test_a_job_that_ends_is_returned():
    job = coordinator.Job(job_id="j", state=coordinator.JOB_STATE_RUNNING,
                          spec=coordinator.JobSpec(steps=2))  # fmt: skip
    client = Running(job)
    job.state = coordinator.JOB_STATE_SUCCEEDED
    assert asyncio.run(wait_for(client, job, timeout_s=5, show=False)).step == 0
