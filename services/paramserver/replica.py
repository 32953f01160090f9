"""A replica's role and epoch, and the fencing rules, as a plain state machine.

Fed the epochs that arrive with requests, it answers whether to serve. No
grpc, no torch.

An epoch only rises by the coordinator's word: ``promote`` and ``configure``
(the coordinator's configuration calls, checked against the coordinator epoch
by the caller). An epoch carried by any other request is compared, never
adopted, so no caller can fence a replica by naming a big number.

Rules:
- A client request with an epoch lower than ours is stale (the caller must
  refresh); one with a higher epoch is refused as ``UNKNOWN_EPOCH``: the caller
  heard of a configuration this replica was not given (it is being deposed, or
  the caller made the number up). The replica goes on serving its own epoch;
  if it was deposed, its next write is refused by its backups (which the
  coordinator configured first) and it fences itself then.
- Replication traffic (from a primary) must carry exactly our epoch: lower is
  a deposed primary (refused, and it fences itself), higher is a primary the
  coordinator has not told us about yet (refused; the coordinator configures
  backups before it promotes).
- Promotion needs a strictly higher epoch.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Role(enum.Enum):
    PRIMARY = "primary"
    BACKUP = "backup"
    FENCED = "fenced"


class Check(enum.Enum):
    OK = "ok"
    STALE_EPOCH = "stale_epoch"  # the caller is behind
    NOT_PRIMARY = "not_primary"
    FENCED = "fenced"  # we are behind: someone else is primary
    UNKNOWN_EPOCH = "unknown_epoch"  # the caller names an epoch nobody configured here
    OLD_COORDINATOR = "old_coordinator"  # an order from a deposed coordinator leader


@dataclass
class BackupLink:
    """A backup as its primary sees it: which jobs it holds current state of."""

    address: str
    synced_jobs: set[str] = field(default_factory=set)
    last_error: str = ""
    # The backup's process the synced jobs are on ("" until one answered with it).
    instance: str = ""

    def answered_from(self, instance: str) -> bool:
        """The backup answered from process ``instance``. True when that is another
        process than the one the synced jobs were on: it was restarted under its
        address and holds none of them, so none counts as in sync any more."""
        restarted = bool(instance and self.instance and instance != self.instance)
        if restarted:
            self.synced_jobs.clear()
        if instance:
            self.instance = instance
        return restarted


@dataclass
class ReplicaState:
    role: Role
    epoch: int
    backups: dict[str, BackupLink] = field(default_factory=dict)
    # highest coordinator epoch whose configuration call this replica obeyed: a
    # deposed coordinator leader's later orders are refused
    coordinator_epoch: int = 0

    def check_client(self, epoch: int) -> Check:
        if self.role is Role.FENCED:
            return Check.FENCED
        if self.role is not Role.PRIMARY:
            return Check.NOT_PRIMARY
        if epoch > self.epoch:
            return Check.UNKNOWN_EPOCH  # compared, never adopted
        if epoch < self.epoch:
            return Check.STALE_EPOCH
        return Check.OK

    def check_from_primary(self, epoch: int) -> Check:
        if epoch < self.epoch:
            return Check.STALE_EPOCH
        if epoch > self.epoch:
            return Check.UNKNOWN_EPOCH  # wait for the coordinator's ConfigureReplica
        if self.role is Role.PRIMARY:  # same epoch, two primaries: never follow
            return Check.STALE_EPOCH
        if self.role is Role.FENCED:  # deposed: only a configuration call brings it back
            return Check.FENCED
        return Check.OK

    def fence(self) -> None:
        self.role = Role.FENCED

    def promote(self, epoch: int, backups: list[str], coordinator_epoch: int = 0) -> Check:
        if coordinator_epoch < self.coordinator_epoch:
            return Check.OLD_COORDINATOR
        if epoch <= self.epoch:
            return Check.STALE_EPOCH
        self.coordinator_epoch = coordinator_epoch
        self.epoch = epoch
        self.role = Role.PRIMARY
        self.backups = {a: BackupLink(a) for a in backups}
        return Check.OK

    def configure(
        self, role: Role, epoch: int, backups: list[str], coordinator_epoch: int = 0
    ) -> Check:
        if coordinator_epoch < self.coordinator_epoch:
            return Check.OLD_COORDINATOR
        if epoch < self.epoch:
            return Check.STALE_EPOCH
        self.coordinator_epoch = coordinator_epoch
        self.epoch = epoch
        self.role = role
        keep = (
            {a: self.backups.get(a, BackupLink(a)) for a in backups} if role is Role.PRIMARY else {}
        )
        self.backups = keep
        return Check.OK
