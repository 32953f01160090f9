"""Which finished jobs' models the paramservers let go of, and which replica is told."""

from __future__ import annotations

from services.coordinator.promotion import ReplicaView
from services.coordinator.retention import Delete, deletions, to_release


def test_all_but_the_last_ended_go_and_running_or_unknown_jobs_never_do():
    held = ["a", "b", "c", "d", "running", "stranger"]
    ended_at = {"a": 30.0, "b": 10.0, "c": 40.0, "d": 20.0, "gone-already": 50.0}
    assert to_release(held, ended_at, keep=2) == ["b", "d"]
    assert to_release(held, ended_at, keep=0) == ["a", "b", "c", "d"]
    assert to_release(held, ended_at, keep=4) == []
    assert to_release(held, ended_at, keep=10) == []
    # a job that ended but is held nowhere counts for nothing: the two held ones stay
    assert to_release(["a", "c"], ended_at, keep=2) == []


def view(node_id: str, role: str, epoch: int, *jobs: str) -> ReplicaView:
    return ReplicaView(node_id, f"{node_id}:1", True, role, epoch, {j: 5 for j in jobs})


def test_the_primary_is_told_and_it_forwards_to_its_backups():
    replicas = [
        (view("p0", "primary", 3, "old", "new"), 0),
        (view("b0", "backup", 3, "old", "new"), 0),
        (view("p1", "primary", 2, "new"), 1),
        (view("b1", "backup", 2, "new"), 1),
    ]
    assert deletions(replicas, ["old"]) == [Delete("p0:1", "old", 3)]
    assert deletions(replicas, ["old", "new"]) == [
        Delete("p0:1", "new", 3),
        Delete("p0:1", "old", 3),
        Delete("p1:1", "new", 2),
    ]


def test_a_backup_the_forward_missed_is_told_itself_under_its_own_epoch():
    replicas = [
        (view("p0", "primary", 3), 0),
        (view("b0", "backup", 3, "old"), 0),
        (view("b1", "backup", 2, "old"), 1),  # another group's primary still holds it
        (view("p1", "primary", 2, "old"), 1),
    ]
    assert deletions(replicas, ["old"]) == [Delete("b0:1", "old", 3), Delete("p1:1", "old", 2)]


def test_fenced_and_unconfigured_replicas_are_left_alone():
    replicas = [(view("f", "fenced", 4, "old"), 0), (view("n", "", 0, "old"), 0)]
    assert deletions(replicas, ["old"]) == []
