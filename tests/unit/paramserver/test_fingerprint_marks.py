"""A GetFingerprint mark lives while someone waits for it: a caller asking for
versions far ahead and giving up left one behind per call, and each commit sorted
them all under the job's lock."""

from __future__ import annotations

import asyncio

from services.paramserver.runtime import JobRuntime


def test_a_mark_is_dropped_when_its_last_waiter_leaves() -> None:
    async def scenario() -> JobRuntime:
        job = JobRuntime(model=None)
        first, second = job.fingerprint_mark(10), job.fingerprint_mark(10)
        assert first is second  # one mark per version, whoever waits
        far = job.fingerprint_mark(10**9)
        job.release_fingerprint_mark(10**9, far)
        assert sorted(job.fingerprint_at) == [10]
        job.release_fingerprint_mark(10, first)
        assert sorted(job.fingerprint_at) == [10]  # the second still waits
        job.release_fingerprint_mark(10, second)
        return job

    job = asyncio.run(scenario())
    assert job.fingerprint_at == {} and job.fingerprint_waiting == {}
