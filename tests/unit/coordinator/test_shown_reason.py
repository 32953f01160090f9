"""A running job waiting for a lost shard group says so in its reason (GetJob, ListJobs)."""

from services.coordinator.convert import job_to_proto, shown_reason
from services.coordinator.jobs import Failed, Job, Running


def _job(num_shards: int = 2, status=None) -> Job:
    job = Job("j", num_slots=2, steps=10, created_at=1.0, num_shards=num_shards)
    job.status = status or Running(2.0)
    return job


def test_a_running_job_names_the_lost_groups_it_waits_for():
    said = shown_reason(_job(num_shards=3), {2, 0, 7})  # group 7 is another job's
    assert said.startswith("waiting: every replica of shard group 0, 2 lost; ")
    assert "restored from its last checkpoint" in said


def test_otherwise_the_state_says_why():
    assert shown_reason(_job(), set()) == "training"
    assert shown_reason(_job(num_shards=1), {1}) == "training"  # not one of its groups
    assert shown_reason(_job(status=Failed(3.0, "boom")), {0}) == "boom"


def test_the_state_store_keeps_the_plain_reason():
    assert job_to_proto(_job()).reason == "training"
    assert job_to_proto(_job(), {1}).reason.startswith("waiting: ")
