"""The primary's commit and forward decisions, event by event, without a network."""

from __future__ import annotations

import itertools

import pytest

from services.paramserver import commit as c
from services.paramserver.consistency import Verdict

B1, B2 = "b1:1", "b2:2"


EPOCH = 3  # this replica's epoch in these rounds


def run(round_: c.CommitRound, events, epoch: int = EPOCH) -> list:
    actions = []
    for event in events:
        actions += round_.feed(event, epoch)
    return actions


def outcomes(actions) -> list:
    return [a for a in actions if isinstance(a, c.Acknowledge | c.Refuse | c.Fail)]


# --- a slot's push -------------------------------------------------------------------

PUSH_CASES = [
    # (id, verdict, completes the step, in-sync backups, required, action)
    ("first-slot-stages", Verdict.ACCEPT, False, 1, 1, c.Stage()),
    ("last-slot-commits", Verdict.ACCEPT, True, 1, 1, c.StartCommit()),
    ("duplicate-acknowledged", Verdict.DUPLICATE, False, 1, 1, c.Acknowledge(7, duplicate=True)),
    # applied before, but no backup holds it yet: acknowledging could lose it
    ("duplicate-without-backup-refused", Verdict.DUPLICATE, False, 0, 1, c.Refuse(0, 1)),
    ("conflict-is-an-error", Verdict.CONFLICT, False, 1, 1, None),
    ("ahead-is-an-error", Verdict.AHEAD, False, 1, 1, None),
]


@pytest.mark.parametrize(
    "verdict,complete,insync,required,expected",
    [case[1:] for case in PUSH_CASES],
    ids=[case[0] for case in PUSH_CASES],
)
def test_on_push(verdict, complete, insync, required, expected):
    assert c.on_push(verdict, complete, 7, insync, required) == expected


# --- one commit round ------------------------------------------------------------------


def test_start_sends_to_every_backup_and_waits_for_the_forwards():
    round_ = c.CommitRound(version=4, targets=(B1, B2), required=1)
    assert round_.start() == [c.AwaitForwards(), c.Replicate(B1), c.Replicate(B2)]


def test_applied_here_only_once_the_forwards_ended():
    round_ = c.CommitRound(version=4, targets=(B1,), required=1)
    round_.start()
    assert round_.feed(c.BackupAcked(B1)) == []  # the backup may be first: it held the pushes
    assert round_.feed(c.ForwardsEnded()) == [c.Apply()]
    assert round_.feed(c.Applied(5)) == [c.LocalStateChanged(), c.Acknowledge(5)]


def test_acknowledged_only_after_apply_and_every_backup():
    round_ = c.CommitRound(version=4, targets=(B1, B2), required=1)
    assert round_.feed(c.ForwardsEnded()) == [c.Apply()]
    assert round_.feed(c.BackupAcked(B1)) == []
    assert round_.feed(c.Applied(5)) == []  # B2 has not answered yet
    assert round_.feed(c.BackupAcked(B2)) == [c.LocalStateChanged(), c.Acknowledge(5)]
    assert round_.done and round_.phase is c.Phase.ACKNOWLEDGED


def test_a_backup_that_missed_a_push_is_dropped_without_a_commit():
    round_ = c.CommitRound(version=4, targets=(B1, B2), required=1, unforwarded=frozenset({B2}))
    actions = round_.start()
    assert c.Replicate(B2) not in actions and c.Replicate(B1) in actions
    assert c.Drop(B2, "missed a push of the step it was to commit") in actions
    actions = run(round_, [c.ForwardsEnded(), c.BackupAcked(B1), c.Applied(5)])
    assert outcomes(actions) == [c.Acknowledge(5)]


def test_a_forward_that_found_this_primary_deposed_applies_nothing():
    round_ = c.CommitRound(version=4, targets=(B1,), required=1)
    events = [
        c.ForwardsEnded("backup at epoch 4"),
        c.EpochRefused(B1, "stale"),
        c.EpochAnswered(B1, 4),
    ]
    actions = run(round_, events)
    assert actions[0] == c.Fence("backup at epoch 4")
    assert c.Apply() not in actions and c.LocalStateChanged() not in actions
    assert outcomes(actions) == [c.Fail(None, "backup at epoch 4")]


def test_no_local_apply_starts_once_a_backup_fenced_this_primary():
    round_ = c.CommitRound(version=4, targets=(B1,), required=1)
    actions = run(round_, [c.EpochRefused(B1, "stale"), c.EpochAnswered(B1, 4), c.ForwardsEnded()])
    assert c.Apply() not in actions
    assert outcomes(actions) == [c.Fail(None, f"backup {B1} is at epoch 4 > 3")]


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_outcome_does_not_depend_on_the_order_of_answers(order):
    events = [c.Applied(5), c.BackupAcked(B1), c.BackupFailed(B2, "timed out")]
    round_ = c.CommitRound(version=4, targets=(B1, B2), required=1)
    actions = run(round_, [c.ForwardsEnded()] + [events[i] for i in order])
    assert c.Drop(B2, "timed out") in actions
    assert outcomes(actions) == [c.Acknowledge(5)]
    assert actions.count(c.LocalStateChanged()) == 1


def test_a_failed_backup_is_dropped_at_once():
    round_ = c.CommitRound(version=4, targets=(B1, B2), required=1)
    assert round_.feed(c.BackupFailed(B1, "unavailable")) == [c.Drop(B1, "unavailable")]


def test_too_few_backups_applied_is_refused_but_stays_applied_here():
    round_ = c.CommitRound(version=4, targets=(B1,), required=1)
    actions = run(round_, [c.ForwardsEnded(), c.BackupFailed(B1, "deadline"), c.Applied(5)])
    # readers are woken (the state changed here) but nothing is acknowledged
    assert actions == [c.Apply(), c.Drop(B1, "deadline"), c.LocalStateChanged(), c.Refuse(0, 1)]
    assert round_.phase is c.Phase.REFUSED


def test_no_backup_required_acknowledges_after_the_local_apply():
    round_ = c.CommitRound(version=0, targets=(), required=0)
    assert round_.start() == [c.AwaitForwards()]
    assert round_.feed(c.ForwardsEnded()) == [c.Apply()]
    assert round_.feed(c.Applied(1)) == [c.LocalStateChanged(), c.Acknowledge(1)]


def test_a_higher_epoch_fences_and_nothing_is_acknowledged():
    round_ = c.CommitRound(version=4, targets=(B1, B2), required=1)
    events = [c.ForwardsEnded(), c.EpochRefused(B1, "stale"), c.EpochAnswered(B1, 9),
              c.BackupAcked(B2), c.Applied(5)]  # fmt: skip
    actions = run(round_, events)
    fenced = f"backup {B1} is at epoch 9 > 3"
    assert actions[:3] == [c.Apply(), c.AskEpoch(B1), c.Fence(fenced)]
    assert outcomes(actions) == [c.Fail(None, fenced)]
    assert not any(isinstance(a, c.Acknowledge) for a in actions)


def test_a_refusal_waits_for_the_backups_epoch_before_any_outcome():
    round_ = c.CommitRound(version=4, targets=(B1,), required=1)
    actions = run(round_, [c.ForwardsEnded(), c.EpochRefused(B1, "stale"), c.Applied(5)])
    assert outcomes(actions) == [] and c.AskEpoch(B1) in actions


@pytest.mark.parametrize("answered", [2003, 1002, None], ids=["same", "lower", "unanswered"])
def test_a_refusal_of_this_replicas_earlier_epoch_drops_the_backup_and_fences_nothing(answered):
    # Promoted again from 1002 to 2003 while a commit sent at 1002 was under way: the
    # backup, configured first, refused the old epoch. It is out of sync; this replica
    # is still the primary, and the client's retry finds the update applied here.
    refusal = "epoch 1002 is older than this replica's 2003"
    round_ = c.CommitRound(version=4, targets=(B1,), required=1)
    events = [c.ForwardsEnded(), c.EpochRefused(B1, refusal), c.EpochAnswered(B1, answered),
              c.Applied(5)]  # fmt: skip
    actions = run(round_, events, epoch=2003)
    assert not any(isinstance(a, c.Fence) for a in actions)
    assert c.Drop(B1, refusal) in actions
    assert outcomes(actions) == [c.Refuse(0, 1)]


def test_fenced_once_even_if_both_backups_say_so():
    round_ = c.CommitRound(version=4, targets=(B1, B2), required=1)
    events = [c.EpochRefused(B1, "a"), c.EpochRefused(B2, "b"), c.EpochAnswered(B1, 9),
              c.EpochAnswered(B2, 9), c.Applied(5)]  # fmt: skip
    actions = run(round_, events)
    assert [a for a in actions if isinstance(a, c.Fence)] == [
        c.Fence(f"backup {B1} is at epoch 9 > 3")
    ]


def test_a_failed_local_apply_is_never_acknowledged():
    boom = RuntimeError("optimizer failed")
    round_ = c.CommitRound(version=4, targets=(B1,), required=1)
    actions = run(round_, [c.ForwardsEnded(), c.BackupAcked(B1), c.ApplyFailed(boom)])
    assert actions == [c.Apply(), c.Fail(boom)]
    assert round_.phase is c.Phase.FAILED


def test_events_after_the_outcome_change_nothing():
    round_ = c.CommitRound(version=4, targets=(B1,), required=1)
    run(round_, [c.ForwardsEnded(), c.BackupAcked(B1), c.Applied(5)])
    assert round_.feed(c.BackupFailed(B1, "late")) == []


# --- forwarding a push ---------------------------------------------------------------


def test_forward_acked_by_every_backup_needs_nothing():
    round_ = c.ForwardRound([B1, B2])
    assert round_.feed(c.BackupAcked(B1), epoch=3) == []
    assert round_.feed(c.BackupAcked(B2), epoch=3) == []
    assert round_.done and not round_.fenced


def test_failed_forward_asks_the_epoch_then_drops():
    round_ = c.ForwardRound([B1])
    assert round_.feed(c.BackupFailed(B1, "reset"), epoch=3) == [c.AskEpoch(B1)]
    assert not round_.done
    assert round_.feed(c.EpochAnswered(B1, 3), epoch=3) == [c.Drop(B1, "reset")]
    assert round_.done


def test_failed_forward_of_an_unreachable_backup_drops_it():
    round_ = c.ForwardRound([B1])
    round_.feed(c.BackupFailed(B1, "reset"), epoch=3)
    assert round_.feed(c.EpochAnswered(B1, None), epoch=3) == [c.Drop(B1, "reset")]


def test_failed_forward_to_a_backup_at_a_higher_epoch_fences():
    round_ = c.ForwardRound([B1, B2])
    round_.feed(c.BackupFailed(B1, "reset"), epoch=3)
    actions = round_.feed(c.EpochAnswered(B1, 4), epoch=3)
    assert len(actions) == 1 and isinstance(actions[0], c.Fence)
    assert round_.done and round_.fenced
    assert round_.feed(c.BackupFailed(B2, "reset"), epoch=3) == []  # fenced: nothing more


def test_a_forward_refused_for_its_epoch_fences_only_below_the_backups_epoch():
    round_ = c.ForwardRound([B1])
    assert round_.feed(c.EpochRefused(B1, "stale epoch"), epoch=3) == [c.AskEpoch(B1)]
    assert round_.feed(c.EpochAnswered(B1, 4), epoch=3) == [
        c.Fence(f"backup {B1} is at epoch 4 > 3")
    ]


def test_a_forward_refused_under_this_replicas_earlier_epoch_drops_the_backup():
    round_ = c.ForwardRound([B1])
    round_.feed(c.EpochRefused(B1, "epoch 1002 is older than this replica's 2003"), epoch=2003)
    actions = round_.feed(c.EpochAnswered(B1, 2003), epoch=2003)
    assert actions == [c.Drop(B1, "epoch 1002 is older than this replica's 2003")]
    assert round_.done and not round_.fenced
