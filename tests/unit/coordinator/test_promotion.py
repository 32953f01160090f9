"""Which paramserver backup is promoted, under which epoch; which replicas become backups."""

from __future__ import annotations

import pytest

from services.coordinator.promotion import (
    AddBackup,
    DropBackups,
    GroupLost,
    Promote,
    ReplicaView,
    behind,
    choose_promotion,
    decide,
    live_primary,
)


def r(node_id, role, *, alive=True, epoch=1, version=0, backups=()):
    return ReplicaView(node_id, f"{node_id}:1", alive, role, epoch, {"j": version}, tuple(backups))


@pytest.mark.parametrize(
    ("group", "primary_id", "expected"),
    [
        # live primary with every replica as backup: nothing to do
        ([r("p", "primary", backups=["b:1"]), r("b", "backup")], "p", []),
        # dead primary: the backup with the highest version wins, epoch = max seen + 1
        (
            [
                r("p", "primary", alive=False, epoch=3),
                r("b1", "backup", version=7),
                r("b2", "backup", version=9),
            ],
            "p",
            [Promote("b2", "b2:1", 4, ("b1:1",))],
        ),
        # equal versions: the higher epoch, then node id, decides (deterministic)
        (
            [
                r("p", "primary", alive=False),
                r("b1", "backup", version=5),
                r("b2", "backup", version=5),
            ],
            "p",
            [Promote("b2", "b2:1", 2, ("b1:1",))],
        ),
        # the dead primary's epoch counts even if backups saw less
        (
            [r("p", "primary", alive=False, epoch=5), r("b", "backup", epoch=2)],
            "p",
            [Promote("b", "b:1", 6, ())],
        ),
        # dead backups are neither candidates nor backups of the new primary
        (
            [
                r("p", "primary", alive=False),
                r("b1", "backup", alive=False, version=99),
                r("b2", "backup", version=1),
            ],
            "p",
            [Promote("b2", "b2:1", 2, ())],
        ),
        # nobody left
        (
            [r("p", "primary", alive=False), r("b", "backup", alive=False)],
            "p",
            [GroupLost("primary dead and no live backup")],
        ),
        # no primary known yet (replicas still starting): never promote blindly
        ([r("b", "backup")], "", []),
        # recorded primary alive but not polled as primary yet: wait
        ([r("p", ""), r("b", "backup")], "p", []),
        # a replica that came back is added to the primary's backups
        (
            [
                r("p", "primary", epoch=4, backups=["b:1"]),
                r("b", "backup", epoch=4),
                r("n", "backup"),
            ],
            "p",
            [AddBackup("p:1", "n:1", 4, ("b:1", "n:1"))],
        ),
        # a restarted old primary (lower epoch) is turned into a backup
        (
            [r("p2", "primary", epoch=4), r("p1", "primary", epoch=1)],
            "p2",
            [AddBackup("p2:1", "p1:1", 4, ("p1:1",))],
        ),
        # another live primary already took over (a previous leader promoted it)
        ([r("p", "primary", alive=False), r("b", "primary", epoch=2)], "p", []),
    ],
)
def test_decide(group, primary_id, expected):
    assert decide(group, primary_id) == expected


def test_a_fresh_backup_without_the_groups_jobs_is_never_promoted() -> None:
    from services.coordinator.promotion import GroupLost, ReplicaView, decide

    group = [
        ReplicaView("old-p", "a:1", False, "primary", 2, {"j": 8}),
        ReplicaView("old-b", "a:2", False, "backup", 2, {"j": 8}),
        ReplicaView("new", "a:3", True, "backup", 1, {}),
    ]
    (decision,) = decide(group, "old-p")
    assert isinstance(decision, GroupLost)


def test_a_new_leader_does_not_promote_a_fresh_replica_over_committed_jobs() -> None:
    # elected after the old pair died: it never polled them, so their views hold no
    # versions; the stored job with committed steps says the group served it
    group = [
        ReplicaView("old-p", "a:1", False),
        ReplicaView("old-b", "a:2", False),
        ReplicaView("new", "a:3", True, "backup", 1, {}),
    ]
    assert decide(group, "old-p") == [Promote("new", "a:3", 2, ())]  # nothing known
    (decision,) = decide(group, "old-p", frozenset({"j"}))
    assert isinstance(decision, GroupLost)


def test_a_fresh_replica_started_as_primary_is_not_adopted_over_committed_jobs() -> None:
    # a fresh pair started for the group, its primary claiming epoch 1 like the old
    # primary did, registered a moment before the old pair was found dead: adopting
    # it would serve empty state to a job at step 8
    group = [
        ReplicaView("old-p", "a:1", False, "primary", 1, {"j": 8}, ("a:2",)),
        ReplicaView("old-b", "a:2", False, "backup", 1, {"j": 8}),
        ReplicaView("new-p", "a:3", True, "primary", 1, {}),
        ReplicaView("new-b", "a:4", True, "backup", 1, {}),
    ]
    committed = frozenset({"j"})
    assert live_primary(group, 1, "old-p", committed) is None
    assert decide(group, "old-p", committed, recorded_epoch=1) == [
        GroupLost("primary dead and no live backup")
    ]
    # with the old primary alive, the fresh claim is no rival for it either
    group[0] = ReplicaView("old-p", "a:1", True, "primary", 1, {"j": 8}, ("a:2",))
    assert live_primary(group, 1, "old-p", committed) == group[0]


def test_a_spare_promoted_by_hand_without_the_jobs_is_not_adopted() -> None:
    # `stalwart ps promote` of the group's warm spare, which holds no job, at an epoch
    # above the group's: adopted, it was given the backup as its own and the job at
    # step 107 stood still for good (its trainers cannot register committed state)
    group = [
        ReplicaView("ps-0a", "a:1", True, "backup", 50, {"j": 107}),
        ReplicaView("ps-0b", "a:2", True, "primary", 50, {"j": 107}, ("a:1",), in_sync=("a:1",)),
        ReplicaView("ps-0c", "a:3", True, "primary", 60, {}),
    ]
    committed = frozenset({"j"})
    assert live_primary(group, 50, "ps-0b", committed) == group[1]
    # seen only after the job ended (nothing committed any more): the recorded primary
    # still holds its model for export, so the stray is not adopted either
    assert live_primary(group, 50, "ps-0b", frozenset()) == group[1]
    # the primary is raised above the stray epoch, with its backups: a client that
    # searched for the primary would otherwise go to the stray (the highest epoch)
    assert decide(group, "ps-0b", committed, wanted=1, recorded_epoch=50) == [
        Promote("ps-0b", "a:2", 61, ("a:1",))
    ]
    group[1] = ReplicaView("ps-0b", "a:2", True, "primary", 61, {"j": 107}, ("a:1",))
    group[0] = ReplicaView("ps-0a", "a:1", True, "backup", 61, {"j": 107})
    assert live_primary(group, 61, "ps-0b", committed) == group[1]
    assert decide(group, "ps-0b", committed, wanted=1, recorded_epoch=61) == []
    group[1] = ReplicaView("ps-0b", "a:2", True, "primary", 50, {"j": 107}, ("a:1",))
    group[0] = ReplicaView("ps-0a", "a:1", True, "backup", 50, {"j": 107})
    # once the recorded primary dies, its backup takes over above the stray epoch and
    # the stray primary becomes a backup like any spare
    group[1] = ReplicaView("ps-0b", "a:2", False, "primary", 50, {"j": 107}, ("a:1",))
    assert decide(group, "ps-0b", committed, wanted=1, recorded_epoch=50) == [
        Promote("ps-0a", "a:1", 61, ())
    ]
    # promoted by hand while holding the jobs (a backup), it is the primary
    group[2] = ReplicaView("ps-0c", "a:3", True, "primary", 60, {"j": 107})
    assert live_primary(group, 50, "ps-0b", committed) == group[2]


def test_a_recorded_primary_fenced_under_a_hand_promotion_is_replaced_by_its_backup() -> None:
    # `stalwart ps promote -a SPARE --epoch 60 -b BACKUP`: the backup, moved to epoch
    # 60, refused the primary's next update and the primary fenced itself; the
    # leader waited for it to claim primary again, and the job stood still for good
    group = [
        ReplicaView("ps-0a", "a:1", True, "fenced", 1, {"j": 131}, ("a:2",)),
        ReplicaView("ps-0b", "a:2", True, "backup", 60, {"j": 131}),
        ReplicaView("ps-0c", "a:3", True, "primary", 60, {}, ("a:2",)),
    ]
    committed = frozenset({"j"})
    assert live_primary(group, 1, "ps-0a", committed) is None
    assert decide(group, "ps-0a", committed, wanted=1, recorded_epoch=1) == [
        Promote("ps-0b", "a:2", 61, ())
    ]
    # not yet polled as primary (no role): waited for, as before
    group[0] = ReplicaView("ps-0a", "a:1", True, "", 0, {})
    assert decide(group, "ps-0a", committed, wanted=1, recorded_epoch=1) == []


def test_every_promotion_goes_above_the_recorded_epoch_too() -> None:
    # The recorded epoch can be above every replica polled since (the leader recorded
    # a promotion whose replica then died, and the others were never at it): a
    # promotion below it would be refused as stale by clients that saw the record.
    group = [
        r("p", "primary", alive=False, epoch=4, version=9, backups=["b:1"]),
        r("b", "backup", epoch=4, version=9),
    ]
    assert decide(group, "p", frozenset({"j"}), recorded_epoch=7) == [Promote("b", "b:1", 8, ())]
    assert choose_promotion(group, frozenset({"j"}), 7) == Promote("b", "b:1", 8, ())
    assert choose_promotion(group, frozenset({"j"})) == Promote("b", "b:1", 5, ())


def test_at_one_epoch_the_recorded_primary_is_kept_over_a_newcomer() -> None:
    # no job committed on the group, so a fresh replica started as primary at the
    # group's epoch counts too; listed first, it used to win the tie
    group = [
        ReplicaView("new-p", "a:3", True, "primary", 1, {}),
        ReplicaView("p", "a:1", True, "primary", 1, {"done": 40}, ("a:2",)),
        ReplicaView("b", "a:2", True, "backup", 1, {"done": 40}),
    ]
    assert live_primary(group, 1, "p") == group[1]
    assert live_primary(group) == group[0]  # nothing recorded: either may lead


def test_the_recorded_primary_mid_restore_is_not_replaced() -> None:
    # a restore on command promoted the recorded primary and is loading the checkpoint
    # onto it: it does not hold the job until the load is done
    group = [
        ReplicaView("p", "a:1", True, "primary", 3, {}),
        ReplicaView("b", "a:2", True, "backup", 2, {"j": 8}),
    ]
    committed = frozenset({"j"})
    assert live_primary(group, 3, "p", committed) == group[0]
    assert not any(isinstance(d, Promote) for d in decide(group, "p", committed, recorded_epoch=3))


def test_the_recorded_primary_restarted_empty_is_replaced_by_its_backup() -> None:
    # its supervisor restarted the primary under the same node id before it was
    # found dead: it claims epoch 1 again and holds nothing; its backup holds step 8
    group = [
        ReplicaView("p", "a:1", True, "primary", 1, {}, (), restarted=True),
        ReplicaView("b", "a:2", True, "backup", 1, {"j": 8}),
    ]
    committed = frozenset({"j"})
    assert live_primary(group, 1, "p", committed) is None
    assert decide(group, "p", committed, recorded_epoch=1) == [Promote("b", "a:2", 2, ())]
    # a trainer registered the job afresh on it before the leader looked: still behind
    group[0] = ReplicaView("p", "a:1", True, "primary", 1, {"j": 0}, ("a:2",), restarted=True)
    assert live_primary(group, 1, "p", committed) is None
    assert decide(group, "p", committed, recorded_epoch=1) == [Promote("b", "a:2", 2, ())]


def test_a_recorded_primary_restarted_as_a_backup_is_not_waited_for() -> None:
    # the recorded primary was a promoted backup; restarted, it claims backup again
    group = [
        ReplicaView("b", "a:2", True, "backup", 1, {}, (), restarted=True),
        ReplicaView("p", "a:1", True, "fenced", 1, {"j": 8}),
        ReplicaView("c", "a:3", True, "backup", 2, {"j": 8}),
    ]
    committed = frozenset({"j"})
    assert decide(group, "b", committed, recorded_epoch=2) == [Promote("c", "a:3", 3, ())]


@pytest.mark.parametrize(
    ("recorded_id", "committed", "versions"),
    [
        ("", frozenset({"j"}), {}),  # no primary recorded yet: the first claim
        ("old-p", frozenset(), {}),  # nothing committed on the group: nothing to lose
        ("old-p", frozenset({"j"}), {"j": 8}),  # it holds the jobs (a restore put them)
    ],
)
def test_a_claim_at_the_recorded_epoch_by_another_node_counts_when_nothing_is_lost(
    recorded_id, committed, versions
) -> None:
    group = [
        ReplicaView("old-p", "a:1", False, "primary", 1, {}),
        ReplicaView("new-p", "a:3", True, "primary", 1, versions),
    ]
    assert live_primary(group, 1, recorded_id, committed) == group[1]


def quarantined(node_id, role, **kw):
    view = r(node_id, role, alive=False, **kw)
    return ReplicaView(*[getattr(view, f) for f in ("node_id", "address", "alive", "role",
                                                    "epoch", "versions", "backups")],
                       quarantined=True)  # fmt: skip


def test_a_quarantined_backup_is_dropped_and_a_spare_added_in_its_place() -> None:
    group = [
        r("p", "primary", backups=["b1:1", "b2:1"]),
        r("b1", "backup"),
        quarantined("b2", "backup"),
        r("spare", "backup"),
    ]
    assert decide(group, "p") == [
        DropBackups("p:1", 1, ("b1:1",)),
        AddBackup("p:1", "spare:1", 1, ("b1:1", "spare:1")),
    ]


def test_a_quarantined_primary_is_replaced_like_a_dead_one() -> None:
    group = [
        quarantined("p", "primary", epoch=2, version=9, backups=["b1:1", "b2:1"]),
        r("b1", "backup", epoch=2, version=9),
        r("b2", "backup", epoch=2, version=9),
    ]
    assert decide(group, "p") == [Promote("b2", "b2:1", 3, ("b1:1",))]


# --- warm spares (a group that keeps a set number of backups) ------------------------


def slow(node_id, role, **kw):
    view = r(node_id, role, **kw)
    return ReplicaView(view.node_id, view.address, True, role, view.epoch, view.versions,
                       view.backups, slow=True)  # fmt: skip


def test_spares_stay_spares_while_the_backups_answer() -> None:
    group = [r("p", "primary", backups=["b:1"]), r("b", "backup"), r("s", "backup")]
    assert decide(group, "p", wanted=1) == []
    # without a wanted count every live replica is a backup (as before)
    assert decide(group, "p") == [AddBackup("p:1", "s:1", 1, ("b:1", "s:1"))]


@pytest.mark.parametrize("backup", [slow("b", "backup"), r("b", "backup", alive=False)])
def test_a_hung_or_dead_backup_gives_its_place_to_a_spare(backup) -> None:
    group = [r("p", "primary", backups=["b:1"]), backup, r("s", "backup")]
    assert decide(group, "p", wanted=1) == [AddBackup("p:1", "s:1", 1, ("s:1",))]


def test_a_slow_spare_is_not_installed() -> None:
    group = [r("p", "primary", backups=["b:1"]), slow("b", "backup"), slow("s", "backup")]
    assert decide(group, "p", wanted=1) == []


def test_a_replaced_backup_is_never_promoted_over_the_primarys_followers() -> None:
    # b was replaced by s while hung (its state stopped at version 5); then p died
    group = [
        r("p", "primary", alive=False, version=9, backups=["s:1"]),
        r("b", "backup", version=5),
        r("s", "backup", version=9),
    ]
    assert decide(group, "p", wanted=1) == [Promote("s", "s:1", 2, ())]
    # and with the follower dead too, the stale one must not serve: the group is lost
    group[2] = r("s", "backup", alive=False, version=9)
    assert decide(group, "p", wanted=1) == [GroupLost("primary dead and no live backup")]


# --- an old primary back from a partition ---------------------------------------------
# o led at epoch 1 and was cut off; n was promoted at epoch 2 (with b as its backup) and
# took every later update. When the partition heals, o registers again and answers
# polls as "primary" at epoch 1, with the state it had when it was cut off: nobody
# told it. It must never count as the group's primary again.


def test_the_old_primary_is_made_a_backup_of_the_new_one() -> None:
    group = [
        r("n", "primary", epoch=2, version=9, backups=["b:1"]),
        r("b", "backup", epoch=2, version=9),
        r("o", "primary", epoch=1, version=4),
    ]
    assert live_primary(group) == group[0]
    assert decide(group, "n") == [AddBackup("n:1", "o:1", 2, ("b:1", "o:1"))]
    assert decide(group, "n", wanted=1) == []  # a spare, like any other, until needed


def test_when_the_new_primary_dies_its_backup_takes_over_not_the_old_primary() -> None:
    group = [
        r("n", "primary", alive=False, epoch=2, version=9, backups=["b:1"]),
        r("b", "backup", epoch=2, version=9),
        r("o", "primary", epoch=1, version=4),  # would serve version 4: updates lost
    ]
    assert live_primary(group) is None
    assert decide(group, "n", wanted=1) == [Promote("b", "b:1", 3, ())]


def test_a_new_leader_knows_the_old_claim_is_stale_from_the_recorded_epoch() -> None:
    # a new leader has polled neither n (dead) nor anything at epoch 2: only the
    # stored group record (n at epoch 2) says o's claim is old
    group = [r("n", "primary", alive=False, epoch=0), r("o", "primary", epoch=1, version=4)]
    assert live_primary(group, recorded_epoch=2) is None
    assert decide(group, "n", recorded_epoch=2) == [GroupLost("primary dead and no live backup")]
    assert live_primary(group) == group[1]  # without the record it would look current


@pytest.mark.parametrize(
    ("versions", "others", "expected"),
    [
        ({}, [{"j": 8}], True),  # empty: lost the job
        ({"j": 0}, [{"j": 8}], True),  # registered afresh: lost its steps
        ({}, [{"j": 0}], True),  # lacks even a job just registered
        ({"j": 8}, [{"j": 8}, {"j": 7}], False),
        ({"j": 9}, [{"j": 8}], False),  # ahead by a commit the others have not applied yet
        ({}, [{}, {}], False),  # nothing anywhere: nothing to lose
    ],
)
def test_behind(versions, others, expected) -> None:
    assert behind(versions, others) is expected


@pytest.mark.parametrize(("role", "epoch"), [("primary", 1), ("backup", 1), ("fenced", 2)])
def test_a_listed_backup_restarted_with_its_flags_is_configured_again(role, epoch) -> None:
    # after a failover to epoch 2 the backup restarted: it answers with its start-up
    # role and epoch, refuses the primary's replication, and is still on its list
    group = [
        ReplicaView("p", "a:1", True, "primary", 2, {"j": 8}, ("a:2",)),
        ReplicaView("b", "a:2", True, role, epoch, {}),
    ]
    # off the list and on again: the primary opens a new link and installs the state
    assert decide(group, "p", frozenset({"j"}), recorded_epoch=2) == [
        DropBackups("a:1", 2, ()),
        AddBackup("a:1", "a:2", 2, ("a:2",)),
    ]


def test_a_listed_backup_at_the_primarys_epoch_is_left_alone() -> None:
    group = [
        ReplicaView("p", "a:1", True, "primary", 2, {"j": 8}, ("a:2",)),
        ReplicaView("b", "a:2", True, "backup", 2, {"j": 8}),
        ReplicaView("n", "a:3", True, "", 0, {}),  # not polled yet
    ]
    assert decide(group, "p", frozenset({"j"}), recorded_epoch=2) == []


def test_a_listed_backup_restarted_under_its_flags_is_added_again() -> None:
    # same role and epoch as before, but a new process without the job, which the
    # primary's link still counts in sync
    group = [
        ReplicaView("p", "a:1", True, "primary", 1, {"j": 8}, ("a:2",), in_sync=("a:2",)),
        ReplicaView("b", "a:2", True, "backup", 1, {}, restarted=True),
    ]
    assert decide(group, "p", frozenset({"j"}), recorded_epoch=1) == [
        DropBackups("a:1", 1, ()),
        AddBackup("a:1", "a:2", 1, ("a:2",)),
    ]
    # re-added, its new link is out of sync until the install is done: left to it
    group[0] = ReplicaView("p", "a:1", True, "primary", 1, {"j": 8}, ("a:2",))
    assert decide(group, "p", frozenset({"j"}), recorded_epoch=1) == []
