"""A time stored by one leader reads back as the same float on the next, so the
order of jobs, and a ListJobs page token made from it, carry over a failover."""

from __future__ import annotations

import asyncio
import random

from services.coordinator.convert import seconds, timestamp
from stalwart import paging
from stalwart.api import coordinator
from tests.unit.coordinator.leaders import elected


def test_every_time_reads_back_as_itself() -> None:
    rng = random.Random(7)
    times = [rng.uniform(1.6e9, 2.2e9) for _ in range(20_000)]  # 2020 to 2039
    assert [seconds(timestamp(t)) for t in times] == times  # through nanoseconds, ~6 % moved


def test_a_page_token_from_one_leader_continues_on_the_next(tmp_path) -> None:
    url = f"shm://{tmp_path}/state"
    control = elected(url, 1)
    spec = coordinator.JobSpec(model="mlp", num_slots=1, steps=10, batch_size=1)
    # the newest job's time is one the old round trip moved down by an ulp: read back,
    # it sorted after the first page's token, and the second page began with it again
    created = {"newest": 1838008284.7904682, "older": 1838008000.0, "oldest": 1838007000.0}
    for job_id, at in created.items():
        asyncio.run(control.create_job(job_id, spec, ""))
        control.jobs[job_id].created_at = at
        control._dirty_jobs.add(job_id)
    asyncio.run(control.tick())

    def order(job):  # ListJobs' key
        return [-job.created_at, job.job_id]

    first, token = paging.page(list(control.jobs.values()), order, 1, "")
    rest, _ = paging.page(list(elected(url, 2).jobs.values()), order, 10, token)
    assert [j.job_id for j in first + rest] == ["newest", "older", "oldest"]
