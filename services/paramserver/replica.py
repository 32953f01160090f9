"""A replica's role and epoch, and the fencing rules, as a plain state machine.

Fed the epochs that arrive with requests, it answers whether to serve and
changes role when it learns of a higher epoch. No grpc, no torch.

Rules:
- A client request with an epoch lower than ours is stale (the caller must
  refresh); one with a higher epoch means someone else was promoted: we adopt
  the epoch, and a primary is deposed and fences itself.
- Replication traffic (from a primary) with a higher epoch is adopted: the
  sender is the current primary and we follow it as a backup. Lower: refused.
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


@dataclass
class BackupLink:
    """A backup as its primary sees it: which jobs it holds current state of."""

    address: str
    synced_jobs: set[str] = field(default_factory=set)
    last_error: str = ""


@dataclass
class ReplicaState:
    role: Role
    epoch: int
    backups: dict[str, BackupLink] = field(default_factory=dict)

    def check_client(self, epoch: int) -> Check:
        if epoch > self.epoch:
            # Someone was promoted past us. Remember the epoch, so replication
            # from the deposed primary is refused too; a primary stops serving.
            self.epoch = epoch
            if self.role is Role.PRIMARY:
                self.role = Role.FENCED
        if self.role is Role.FENCED:
            return Check.FENCED
        if self.role is not Role.PRIMARY:
            return Check.NOT_PRIMARY
        if epoch < self.epoch:
            return Check.STALE_EPOCH
        return Check.OK

    def check_from_primary(self, epoch: int) -> Check:
        if epoch < self.epoch:
            return Check.STALE_EPOCH
        if epoch > self.epoch or self.role is Role.FENCED:
            self.epoch = epoch
            self.role = Role.BACKUP
            self.backups = {}
        if self.role is Role.PRIMARY:  # same epoch, two primaries: never follow
            return Check.STALE_EPOCH
        return Check.OK

    def fence(self) -> None:
        self.role = Role.FENCED

    def promote(self, epoch: int, backups: list[str]) -> Check:
        if epoch <= self.epoch:
            return Check.STALE_EPOCH
        self.epoch = epoch
        self.role = Role.PRIMARY
        self.backups = {a: BackupLink(a) for a in backups}
        return Check.OK

    def configure(self, role: Role, epoch: int, backups: list[str]) -> Check:
        if epoch < self.epoch:
            return Check.STALE_EPOCH
        self.epoch = epoch
        self.role = role
        keep = (
            {a: self.backups.get(a, BackupLink(a)) for a in backups} if role is Role.PRIMARY else {}
        )
        self.backups = keep
        return Check.OK
