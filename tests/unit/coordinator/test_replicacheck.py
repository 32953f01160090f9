"""The vote over paramserver replica fingerprints at a checkpoint."""

from __future__ import annotations

from services.coordinator.promotion import ReplicaView
from services.coordinator.replicacheck import Judgement, describe, judge, voters


def test_agreeing_replicas_publish() -> None:
    assert judge("p", {"p": 7, "b1": 7, "b2": 7}) == Judgement(
        checked=True, agree=True, publish=True, voters=3
    )


def test_an_outvoted_backup_is_quarantined_and_the_checkpoint_published() -> None:
    got = judge("p", {"p": 7, "b1": 7, "b2": 9})
    assert (got.agree, got.publish, got.quarantine, got.restore) == (False, True, ("b2",), False)


def test_an_outvoted_primary_is_quarantined_and_its_snapshot_not_published() -> None:
    got = judge("p", {"p": 9, "b1": 7, "b2": 7})
    assert (got.publish, got.quarantine, got.restore) == (False, ("p",), False)


def test_a_tie_blames_nobody_and_goes_back_to_the_last_agreed_checkpoint() -> None:
    got = judge("p", {"p": 9, "b1": 7})
    assert (got.checked, got.publish, got.quarantine, got.restore) == (True, False, (), True)
    three_ways = judge("p", {"p": 1, "b1": 2, "b2": 3})
    assert (three_ways.publish, three_ways.quarantine, three_ways.restore) == (False, (), True)


def test_too_few_answers_check_nothing() -> None:
    for prints in ({"p": 7}, {"b1": 7, "b2": 9}, {}):
        got = judge("p", prints)
        assert (got.checked, got.publish, got.quarantine, got.restore) == (False, True, (), False)


def test_describe_names_every_voter() -> None:
    assert describe({"b": 0xA, "a": 0xFFFFFFFF}) == "a=ffffffff, b=0000000a"


def _view(node_id, role, *, alive=True, backups=(), jobs=("j",)):
    return ReplicaView(node_id, f"{node_id}:1", alive, role, 2, dict.fromkeys(jobs, 5),
                       tuple(backups))  # fmt: skip


def test_only_the_primary_and_the_backups_it_replicates_to_vote() -> None:
    group = [
        _view("p", "primary", backups=["b:1", "gone:1"]),
        _view("b", "backup"),
        _view("gone", "backup", alive=False),
        _view("hung", "backup"),  # replaced by b while it hung: its state stopped
        _view("old", "primary"),  # an old primary back from a partition, never told
        _view("spare", "backup", jobs=()),
    ]
    assert voters(group, "p", "j") == {"p": "p:1", "b": "b:1"}
    assert voters(group, "p", "other") == {}  # nobody holds that job
    assert voters(group, "", "j") == {}  # no primary recorded: nothing to compare
