"""Finished jobs do not pile up: past --keep-finished-jobs the records of those that ended
first are forgotten, in memory and in the store; a job with checkpoints is kept for good
(exporting a checkpoint needs its spec), and a successor leader agrees."""

from __future__ import annotations

import asyncio

from services.coordinator.retention import JobRetention
from services.coordinator.sdcguard import SdcGuard
from services.coordinator.settings import CoordinatorSettings
from stalwart.api import coordinator
from stalwart.errors import ErrorKind, StalwartError
from tests.unit.coordinator.leaders import elected

KEEP = 100


class _Checkpoints:
    """What JobRetention asks of services.coordinator.checkpoints.Checkpoints."""

    def __init__(self, with_checkpoints: set[str], unreadable: set[str] = frozenset()):
        self.with_checkpoints = with_checkpoints
        self.unreadable = unreadable
        self.asked: list[str] = []

    async def list(self, job_id: str) -> list[str]:
        self.asked.append(job_id)
        if job_id in self.unreadable:
            raise StalwartError(ErrorKind.UNAVAILABLE, "checkpoint store timed out")
        return ["a checkpoint"] if job_id in self.with_checkpoints else []


def _leader(url: str, epoch: int, checkpoints: _Checkpoints):
    control = elected(url, epoch)
    control.settings = CoordinatorSettings(store_url=url, keep_finished_jobs=KEEP)
    control.checkpoints = checkpoints
    return control


def test_the_first_to_end_are_forgotten_but_not_those_with_checkpoints(tmp_path) -> None:
    url = f"shm://{tmp_path}/state"
    control = _leader(url, 1, _Checkpoints({"j-102"}))
    spec = coordinator.JobSpec(model="mlp", num_slots=1, steps=10, batch_size=1)
    names = [f"j-{i:03d}" for i in range(KEEP + 5)]
    for job_id in names:
        asyncio.run(control.create_job(job_id, spec, ""))
    asyncio.run(control.create_job("running", spec, ""))
    for job_id in reversed(names):  # they end newest first: j-104 is the first to end
        asyncio.run(control.cancel_job(job_id, "done"))

    asyncio.run(JobRetention(control).round())
    forgotten = {"j-104", "j-103", "j-101", "j-100"}  # the first five to end, but j-102
    assert set(control.jobs) == set(names) - forgotten | {"running"}
    assert {j.job_id for j in control.state.jobs()} == set(control.jobs)
    assert len(control.finished_order) == KEEP  # j-102 no longer counts
    with_limit_met = list(control.checkpoints.asked)
    asyncio.run(JobRetention(control).round())
    assert control.checkpoints.asked == with_limit_met  # nothing over the limit: no reads

    # a new leader loads what is left; it asks about j-102 once more and keeps it
    successor = _leader(url, 2, _Checkpoints({"j-102"}))
    assert set(successor.jobs) == set(control.jobs)
    asyncio.run(JobRetention(successor).round())
    assert set(successor.jobs) == set(control.jobs)
    assert successor.checkpoints.asked == ["j-102"]


def test_a_job_the_checkpoint_store_cannot_answer_for_is_kept_and_asked_again(
    tmp_path,
) -> None:
    url = f"shm://{tmp_path}/state"
    control = _leader(url, 1, _Checkpoints(set(), unreadable={"j-001"}))
    spec = coordinator.JobSpec(model="mlp", num_slots=1, steps=10, batch_size=1)
    names = [f"j-{i:03d}" for i in range(KEEP + 3)]
    for job_id in names:
        asyncio.run(control.create_job(job_id, spec, ""))
        asyncio.run(control.cancel_job(job_id, "done"))
    asyncio.run(JobRetention(control).round())
    assert set(names) - set(control.jobs) == {"j-000"}  # stopped at j-001
    control.checkpoints.unreadable = set()
    asyncio.run(JobRetention(control).round())
    assert set(names) - set(control.jobs) == {"j-000", "j-001", "j-002"}


def test_a_finished_jobs_gradient_checks_are_dropped_and_nobody_is_asked_about_them(
    tmp_path,
) -> None:
    control = elected(f"shm://{tmp_path}/state", 1)
    control.sdc = SdcGuard(control, verifier_timeout_s=10.0)
    spec = coordinator.JobSpec(model="mlp", num_slots=1, steps=10, batch_size=1)
    for job_id in ("ended", "running"):
        asyncio.run(control.create_job(job_id, spec, ""))
        control.sdc.checks.holder_report((job_id, 3, 0), "t1", 123, ["t2"], now=0.0)
    assert [k[0] for k in control.sdc.checks.asked_of("t2")] == ["ended", "running"]
    asyncio.run(control.cancel_job("ended", "done"))
    assert [k[0] for k in control.sdc.checks.asked_of("t2")] == ["running"]
    assert [k[0] for k in control.sdc.checks.checks] == ["running"]


def test_a_create_retried_after_its_job_was_forgotten_is_refused_not_run_again(
    tmp_path,
) -> None:
    url = f"shm://{tmp_path}/state"
    control = _leader(url, 1, _Checkpoints(set()))
    spec = coordinator.JobSpec(model="mlp", num_slots=1, steps=10, batch_size=1)
    first = asyncio.run(control.create_job("", spec, "create-first"))
    asyncio.run(control.cancel_job(first.job_id, "done"))
    for i in range(KEEP):
        asyncio.run(control.create_job(f"j-{i:03d}", spec, f"create-{i}"))
        asyncio.run(control.cancel_job(f"j-{i:03d}", "done"))
    assert asyncio.run(control.create_job("", spec, "create-0")).job_id == "j-000"  # kept
    asyncio.run(JobRetention(control).round())
    assert first.job_id not in control.jobs

    _assert_refused(control, spec, "create-first", first.job_id)
    _assert_refused(_leader(url, 2, _Checkpoints(set())), spec, "create-first", first.job_id)


def _assert_refused(leader, spec, request_id: str, job_id: str) -> None:
    try:
        asyncio.run(leader.create_job("", spec, request_id))
    except StalwartError as err:
        assert err.kind is ErrorKind.ALREADY_EXISTS
        assert job_id in err.message and "--keep-finished-jobs" in err.message
    else:
        raise AssertionError("a forgotten job was admitted again")
    assert job_id not in leader.jobs


def test_a_create_whose_record_was_never_stored_is_admitted_on_retry(tmp_path) -> None:
    url = f"shm://{tmp_path}/state"
    control = _leader(url, 1, _Checkpoints(set()))
    spec = coordinator.JobSpec(model="mlp", num_slots=1, steps=10, batch_size=1)
    # the leader stored the request's job id, then died before the job's record
    assert control.state.put_request(control.epoch, "create-lost", "job-lost") == "job-lost"
    successor = _leader(url, 2, _Checkpoints(set()))
    job = asyncio.run(successor.create_job("", spec, "create-lost"))
    assert job.job_id == "job-lost" and "job-lost" in successor.jobs
    assert successor.state.request_job("create-lost").admitted
