"""Replica fencing rules, case by case, on the plain state machine."""

from __future__ import annotations

import pytest

from services.paramserver.replica import BackupLink, Check, ReplicaState, Role


def replica(role: Role, epoch: int = 5, backups=("b1:1", "b2:2")) -> ReplicaState:
    state = ReplicaState(role=role, epoch=epoch)
    if role is Role.PRIMARY:
        state.backups = {a: BackupLink(a) for a in backups}
    return state


# --- client requests ------------------------------------------------------------------

CLIENT_CASES = [
    # (id, our role, client epoch, check, role after)
    ("primary-equal", Role.PRIMARY, 5, Check.OK, Role.PRIMARY),
    ("primary-lower", Role.PRIMARY, 4, Check.STALE_EPOCH, Role.PRIMARY),
    ("primary-much-lower", Role.PRIMARY, 0, Check.STALE_EPOCH, Role.PRIMARY),
    # a higher epoch is refused, never adopted: no caller can depose a primary
    ("primary-higher-refused", Role.PRIMARY, 6, Check.UNKNOWN_EPOCH, Role.PRIMARY),
    ("primary-much-higher-refused", Role.PRIMARY, 1001, Check.UNKNOWN_EPOCH, Role.PRIMARY),
    ("backup-equal", Role.BACKUP, 5, Check.NOT_PRIMARY, Role.BACKUP),
    ("backup-lower", Role.BACKUP, 4, Check.NOT_PRIMARY, Role.BACKUP),
    ("backup-higher", Role.BACKUP, 7, Check.NOT_PRIMARY, Role.BACKUP),
    ("fenced-equal", Role.FENCED, 5, Check.FENCED, Role.FENCED),
    ("fenced-lower", Role.FENCED, 3, Check.FENCED, Role.FENCED),
    ("fenced-higher", Role.FENCED, 9, Check.FENCED, Role.FENCED),
]


@pytest.mark.parametrize(
    "role,epoch,check,after", [c[1:] for c in CLIENT_CASES], ids=[c[0] for c in CLIENT_CASES]
)
def test_check_client(role, epoch, check, after):
    state = replica(role)
    assert state.check_client(epoch) is check
    assert state.role is after
    assert state.epoch == 5  # a client's epoch is compared, never adopted


def test_primary_keeps_serving_after_a_made_up_epoch():
    state = replica(Role.PRIMARY)
    assert state.check_client(1001) is Check.UNKNOWN_EPOCH
    assert state.check_client(5) is Check.OK
    assert (state.role, state.epoch) == (Role.PRIMARY, 5)


def test_deposed_primary_stays_fenced_for_every_later_client():
    state = replica(Role.PRIMARY)
    state.fence()
    for epoch in (4, 5, 6, 7):
        assert state.check_client(epoch) is Check.FENCED
    assert state.role is Role.FENCED


# --- replication from a primary -----------------------------------------------------

PRIMARY_CASES = [
    # (id, our role, sender epoch, check, role after, epoch after)
    ("backup-equal-follows", Role.BACKUP, 5, Check.OK, Role.BACKUP, 5),
    ("backup-lower-refused", Role.BACKUP, 4, Check.STALE_EPOCH, Role.BACKUP, 5),
    # only the coordinator's configuration calls raise an epoch
    ("backup-higher-refused", Role.BACKUP, 8, Check.UNKNOWN_EPOCH, Role.BACKUP, 5),
    ("primary-higher-refused", Role.PRIMARY, 6, Check.UNKNOWN_EPOCH, Role.PRIMARY, 5),
    ("primary-equal-never-follows", Role.PRIMARY, 5, Check.STALE_EPOCH, Role.PRIMARY, 5),
    ("primary-lower-refused", Role.PRIMARY, 2, Check.STALE_EPOCH, Role.PRIMARY, 5),
    ("fenced-equal-refused", Role.FENCED, 5, Check.FENCED, Role.FENCED, 5),
    ("fenced-higher-refused", Role.FENCED, 9, Check.UNKNOWN_EPOCH, Role.FENCED, 5),
    ("fenced-lower-refused", Role.FENCED, 4, Check.STALE_EPOCH, Role.FENCED, 5),
]


@pytest.mark.parametrize(
    "role,epoch,check,after,epoch_after",
    [c[1:] for c in PRIMARY_CASES],
    ids=[c[0] for c in PRIMARY_CASES],
)
def test_check_from_primary(role, epoch, check, after, epoch_after):
    state = replica(role)
    backups_before = dict(state.backups)
    assert state.check_from_primary(epoch) is check
    assert state.role is after
    assert state.epoch == epoch_after
    if after is Role.BACKUP and role is not Role.BACKUP:
        assert state.backups == {}  # a backup forwards to no one
    elif role is Role.PRIMARY:
        assert state.backups == backups_before


def test_configured_backup_refuses_clients_and_old_primary_traffic():
    state = replica(Role.PRIMARY, epoch=3)
    assert state.configure(Role.BACKUP, 4, [], coordinator_epoch=2) is Check.OK
    assert state.check_client(4) is Check.NOT_PRIMARY
    assert state.check_client(3) is Check.NOT_PRIMARY
    assert state.check_from_primary(3) is Check.STALE_EPOCH  # the old primary, fenced
    assert state.check_from_primary(4) is Check.OK


def test_fenced_replica_returns_only_by_a_configuration_call():
    state = replica(Role.PRIMARY, epoch=1)
    state.fence()
    assert state.check_from_primary(2) is Check.UNKNOWN_EPOCH
    assert state.configure(Role.BACKUP, 2, []) is Check.OK
    assert state.check_from_primary(2) is Check.OK
    assert (state.role, state.epoch) == (Role.BACKUP, 2)


def test_orders_of_a_deposed_coordinator_are_refused():
    state = replica(Role.BACKUP, epoch=1)
    assert state.configure(Role.BACKUP, 2, [], coordinator_epoch=7) is Check.OK
    assert state.promote(3, [], coordinator_epoch=6) is Check.OLD_COORDINATOR
    assert state.configure(Role.PRIMARY, 3, [], coordinator_epoch=6) is Check.OLD_COORDINATOR
    assert (state.role, state.epoch, state.coordinator_epoch) == (Role.BACKUP, 2, 7)
    assert state.promote(3, [], coordinator_epoch=8) is Check.OK
    assert (state.role, state.epoch, state.coordinator_epoch) == (Role.PRIMARY, 3, 8)


def test_fence():
    for role in Role:
        state = replica(role)
        state.fence()
        assert state.role is Role.FENCED
        assert state.epoch == 5
        assert state.check_client(5) is Check.FENCED


# --- promotion ------------------------------------------------------------------------


@pytest.mark.parametrize("role", list(Role), ids=lambda r: r.value)
@pytest.mark.parametrize(
    "epoch,check", [(4, Check.STALE_EPOCH), (5, Check.STALE_EPOCH), (6, Check.OK), (60, Check.OK)]
)
def test_promote_needs_strictly_higher_epoch(role, epoch, check):
    state = replica(role)
    before = (state.role, state.epoch, dict(state.backups))
    assert state.promote(epoch, ["x:1", "y:2"]) is check
    if check is Check.OK:
        assert (state.role, state.epoch) == (Role.PRIMARY, epoch)
        assert set(state.backups) == {"x:1", "y:2"}
        assert all(link.synced_jobs == set() for link in state.backups.values())
        assert state.check_client(epoch) is Check.OK
        assert state.check_client(epoch - 1) is Check.STALE_EPOCH
    else:
        assert (state.role, state.epoch, state.backups) == before


def test_promote_forgets_sync_marks_of_old_links():
    state = replica(Role.PRIMARY)
    state.backups["b1:1"].synced_jobs.add("job")
    assert state.promote(6, ["b1:1"]) is Check.OK
    assert state.backups["b1:1"].synced_jobs == set()


# --- configure ------------------------------------------------------------------------


def test_configure_lower_epoch_is_refused():
    state = replica(Role.BACKUP)
    assert state.configure(Role.PRIMARY, 4, ["b:1"]) is Check.STALE_EPOCH
    assert (state.role, state.epoch, state.backups) == (Role.BACKUP, 5, {})


@pytest.mark.parametrize("epoch", [5, 6])
def test_configure_equal_or_higher_epoch(epoch):
    state = replica(Role.BACKUP)
    assert state.configure(Role.PRIMARY, epoch, ["b1:1", "b2:2"]) is Check.OK
    assert (state.role, state.epoch) == (Role.PRIMARY, epoch)
    assert set(state.backups) == {"b1:1", "b2:2"}


def test_configure_primary_keeps_existing_links_and_drops_removed_ones():
    state = replica(Role.PRIMARY)
    state.backups["b1:1"].synced_jobs.add("job-a")
    link = state.backups["b1:1"]
    assert state.configure(Role.PRIMARY, 5, ["b1:1", "b3:3"]) is Check.OK
    assert set(state.backups) == {"b1:1", "b3:3"}
    assert state.backups["b1:1"] is link
    assert state.backups["b1:1"].synced_jobs == {"job-a"}
    assert state.backups["b3:3"].synced_jobs == set()


@pytest.mark.parametrize("role", [Role.BACKUP, Role.FENCED])
def test_configure_non_primary_has_no_backups(role):
    state = replica(Role.PRIMARY)
    assert state.configure(role, 7, ["b1:1"]) is Check.OK
    assert (state.role, state.epoch, state.backups) == (role, 7, {})


def test_a_backup_answering_from_another_process_holds_no_job_in_sync():
    link = BackupLink("b1:1")
    link.synced_jobs.add("j1")
    assert not link.answered_from("p1")  # the first process seen: nothing to compare
    link.synced_jobs.add("j2")
    assert not link.answered_from("p1")
    assert not link.answered_from("")  # a backup that does not say: taken as the same
    assert link.synced_jobs == {"j1", "j2"}
    assert link.answered_from("p2")  # restarted under its address: holds nothing
    assert (link.synced_jobs, link.instance) == (set(), "p2")
    link.synced_jobs.add("j1")  # installed on the new process
    assert not link.answered_from("p2") and link.synced_jobs == {"j1"}
