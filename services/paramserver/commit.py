"""The primary's replication and commit decisions, as plain state machines.

Fed events (a slot's push arrived, a backup acknowledged, a backup failed or
timed out, a backup named a higher epoch, the local apply finished), they
return actions (stage, apply, send the commit to a backup, drop a backup,
fence, acknowledge, refuse). No grpc, no torch, no clock: the servicer and
:mod:`services.paramserver.runtime` perform the actions and feed back what
came of them, the way etcd's raft core leaves network and disk to its user.

Promises these machines keep, whatever order the events come in:
- an update is acknowledged only once it is applied here and on at least
  ``required`` backups (every backup in sync when the commit started either
  applied it or is dropped from sync);
- a backup that names a higher epoch fences this primary, and nothing is
  acknowledged after that;
- a failed local apply is never acknowledged.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from services.paramserver.consistency import Verdict

# --- events ------------------------------------------------------------------------


@dataclass(frozen=True)
class Applied:
    """The local apply finished: the job is at ``version`` here."""

    version: int


@dataclass(frozen=True)
class ApplyFailed:
    error: BaseException


@dataclass(frozen=True)
class BackupAcked:
    address: str


@dataclass(frozen=True)
class BackupFailed:
    """The backup refused, broke or did not answer within the ack timeout."""

    address: str
    reason: str


@dataclass(frozen=True)
class EpochRefused:
    """A backup refused a request as of an older epoch than its own, or as deposed.

    Not proof that this primary is deposed: the request may date from before this
    replica was promoted again (a re-promotion configures the backups first, so a
    commit begun under the old epoch meets a backup already at the new one). The
    primary asks the backup's epoch and fences only below it (:class:`EpochAnswered`).
    """

    address: str
    reason: str


@dataclass(frozen=True)
class ForwardsEnded:
    """The forwards of the round's pushes all ended; ``fence_reason`` is set when one
    of them found this primary deposed."""

    fence_reason: str = ""


@dataclass(frozen=True)
class EpochAnswered:
    """A backup whose forward or commit failed answered its epoch (None: it did not answer)."""

    address: str
    epoch: int | None


RoundEvent = (
    ForwardsEnded | Applied | ApplyFailed | BackupAcked | BackupFailed | EpochRefused | EpochAnswered
)  # fmt: skip


def above_this_replica(answer: EpochAnswered, epoch: int) -> str:
    """Why a backup's answered epoch deposes this replica, at ``epoch``."""
    return f"backup {answer.address} is at epoch {answer.epoch} > {epoch}"


# --- actions -----------------------------------------------------------------------


@dataclass(frozen=True)
class Stage:
    """Buffer the push; the step waits for its other slots."""


@dataclass(frozen=True)
class StartCommit:
    """The push completes its step: commit it (see :class:`CommitRound`)."""


@dataclass(frozen=True)
class AwaitForwards:
    """Wait for the forwards of the round's pushes to the backups to end."""


@dataclass(frozen=True)
class Apply:
    """Sum and apply the entries on this replica."""


@dataclass(frozen=True)
class Replicate:
    """Send the commit to one backup."""

    address: str


@dataclass(frozen=True)
class AskEpoch:
    """Ask a backup whose forward or commit failed which epoch it is at."""

    address: str


@dataclass(frozen=True)
class Drop:
    """The backup no longer holds the job's current state: out of sync."""

    address: str
    reason: str


@dataclass(frozen=True)
class Fence:
    reason: str


@dataclass(frozen=True)
class LocalStateChanged:
    """The update is applied here: run the after-apply hooks, wake readers."""


@dataclass(frozen=True)
class Acknowledge:
    version: int
    duplicate: bool = False


@dataclass(frozen=True)
class Refuse:
    """Not enough backups hold the update: do not acknowledge; the client retries."""

    have: int
    need: int


@dataclass(frozen=True)
class Fail:
    """The local apply failed, or the primary is fenced: answer the error."""

    error: BaseException | None = None  # None: fenced (see the Fence action's reason)
    reason: str = ""


Action = (
    Stage | StartCommit | AwaitForwards | Apply | Replicate | AskEpoch | Drop | Fence | LocalStateChanged
    | Acknowledge | Refuse | Fail
)  # fmt: skip


# --- a slot's push -----------------------------------------------------------------


def on_push(
    verdict: Verdict, step_complete: bool, version: int, insync: int, required: int
) -> Action | None:
    """What to do with a push the consistency rules judged (None: the verdict is an error,
    or WAIT, which the caller handles before asking).

    ``step_complete`` says whether staging this push completes its step (always
    true outside sync mode); ``insync`` counts the backups holding the job now.
    """
    if verdict is Verdict.DUPLICATE:
        # applied before: acknowledged again only once enough backups hold it too
        if insync < required:
            return Refuse(insync, required)
        return Acknowledge(version, duplicate=True)
    if verdict is not Verdict.ACCEPT:
        return None
    return StartCommit() if step_complete else Stage()


# --- forwarding a push to the backups ------------------------------------------------


class ForwardRound:
    """The backups a push was forwarded to, until each forward ended.

    A forward that failed may not say why (a backup that refused a stale epoch
    can look like one that broke), and one refused for its epoch may date from
    before this replica was promoted again, so before going on without it the
    primary asks its epoch: only one above this replica's fences it.
    """

    def __init__(self, targets: Sequence[str]):
        self.open = set(targets)
        self.failed: dict[str, str] = {}  # address -> why its forward failed
        self.fenced = False

    def feed(self, event: BackupAcked | BackupFailed | EpochRefused | EpochAnswered,
             epoch: int) -> list[Action]:  # fmt: skip
        """``epoch``: this replica's epoch now (an answered epoch is compared with it)."""
        if self.fenced:
            return []
        if isinstance(event, BackupAcked):
            self.open.discard(event.address)
            return []
        if isinstance(event, BackupFailed | EpochRefused):
            self.failed[event.address] = event.reason
            return [AskEpoch(event.address)]
        # EpochAnswered
        self.open.discard(event.address)
        if event.epoch is not None and event.epoch > epoch:
            return self._fence(above_this_replica(event, epoch))
        return [Drop(event.address, self.failed.get(event.address, ""))]

    def _fence(self, reason: str) -> list[Action]:
        self.fenced = True
        return [Fence(reason)]

    @property
    def done(self) -> bool:
        return self.fenced or not self.open


# --- committing one update -----------------------------------------------------------


class Phase(enum.Enum):
    RUNNING = "running"
    ACKNOWLEDGED = "acknowledged"
    REFUSED = "refused"
    FAILED = "failed"


@dataclass
class CommitRound:
    """One update: applied here and on every backup in sync, alongside each other.

    ``start`` sends the commit to each backup at once and waits for the forwards
    of the round's pushes (a push is forwarded to the backups while it streams
    in, and its handler does not wait for the backups' answer before staging
    it): a backup applies the commit as soon as it holds every push the commit
    names. The local apply starts only once those forwards ended without
    finding this primary deposed, so a fenced primary applies nothing. Each
    answer is fed back; once the local side and every backup have answered,
    exactly one outcome follows (acknowledge, refuse or fail). If backups fail
    the update stays applied here but unacknowledged: the client's retry finds
    it a duplicate and is answered once re-installed backups hold it.
    """

    version: int  # the version before the update
    targets: tuple[str, ...]  # the backups in sync for the job
    required: int
    # targets that missed the forward of one of the round's pushes (in sync only
    # since): they cannot apply the commit and are dropped at once
    unforwarded: frozenset[str] = frozenset()
    phase: Phase = Phase.RUNNING
    acked: set[str] = field(default_factory=set)
    answered: set[str] = field(default_factory=set)
    applying: bool = False
    applied_version: int | None = None
    local_error: BaseException | None = None
    fence_reason: str = ""
    refused: dict[str, str] = field(default_factory=dict)  # backup -> why, until it answers

    def start(self) -> list[Action]:
        actions: list[Action] = [AwaitForwards()]
        for address in self.targets:
            if address in self.unforwarded:
                self.answered.add(address)
                actions.append(Drop(address, "missed a push of the step it was to commit"))
            else:
                actions.append(Replicate(address))
        return actions

    def feed(
        self,
        event: RoundEvent,
        epoch: int = 0,
    ) -> list[Action]:
        """``epoch``: this replica's epoch now, which an answered epoch is compared with
        (0, for events that need none, fences on any answer)."""
        if self.phase is not Phase.RUNNING:
            return []
        actions: list[Action] = []
        if isinstance(event, ForwardsEnded):
            if event.fence_reason:
                actions += self._fence(event.fence_reason)
            if not self.fence_reason:
                self.applying = True
                actions.append(Apply())
        elif isinstance(event, Applied):
            self.applied_version = event.version
        elif isinstance(event, ApplyFailed):
            self.local_error = event.error
        elif isinstance(event, BackupAcked):
            self.answered.add(event.address)
            self.acked.add(event.address)
        elif isinstance(event, BackupFailed):
            self.answered.add(event.address)
            actions.append(Drop(event.address, event.reason))
        elif isinstance(event, EpochRefused):
            self.refused[event.address] = event.reason
            actions.append(AskEpoch(event.address))
        elif isinstance(event, EpochAnswered):
            self.answered.add(event.address)
            reason = self.refused.get(event.address, "")
            if event.epoch is not None and event.epoch > epoch:
                actions += self._fence(above_this_replica(event, epoch))
            else:  # it refused an earlier epoch of this replica's: out of sync, not deposing
                actions.append(Drop(event.address, reason))
        return actions + self._outcome()

    def _fence(self, reason: str) -> list[Action]:
        if self.fence_reason:
            return []
        self.fence_reason = reason
        return [Fence(reason)]

    def _outcome(self) -> list[Action]:
        if self.answered != set(self.targets):
            return []
        if self.applying and self.applied_version is None and self.local_error is None:
            return []  # the local apply is still running
        if not self.applying and not self.fence_reason:
            return []  # the forwards have not ended yet
        if self.local_error is not None:
            self.phase = Phase.FAILED
            return [Fail(self.local_error)]
        # applied here: readers may look once the outcome is known (they still see
        # only state enough in-sync backups hold, see ParamServer._readable)
        changed: list[Action] = [LocalStateChanged()] if self.applied_version is not None else []
        if self.fence_reason:
            self.phase = Phase.FAILED
            return [*changed, Fail(None, self.fence_reason)]
        if len(self.acked) < self.required:
            self.phase = Phase.REFUSED
            return [*changed, Refuse(len(self.acked), self.required)]
        self.phase = Phase.ACKNOWLEDGED
        return [*changed, Acknowledge(self.applied_version)]

    @property
    def done(self) -> bool:
        return self.phase is not Phase.RUNNING
