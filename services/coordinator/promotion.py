"""Paramserver shard groups: which backup to promote, under which epoch, and
which replicas to add as backups. Pure: fed what the coordinator last polled.

A group is the set of registered paramserver replicas with the same shard
index. The coordinator remembers the group's primary. When that primary is
declared dead and no live replica claims to be primary, the live backup with
the highest applied version is promoted with ``epoch = highest epoch seen in
the group + 1`` and the other live replicas as its backups. A live replica that
is neither the primary nor among its backups is added to them, unless the group
keeps a set number of backups (``wanted``): then the other live replicas are warm
spares, and one is added only when a backup is dead or has stopped answering
polls (``slow``), in its place.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ReplicaView:
    """One replica as last polled (``role``: primary, backup, fenced, or "" if never)."""

    node_id: str
    address: str
    alive: bool
    role: str = ""
    epoch: int = 0
    versions: dict[str, int] = field(default_factory=dict)  # job id -> applied version
    backups: tuple[str, ...] = ()  # for a primary: addresses it replicates to
    quarantined: bool = False  # alive is False too: out of the group for good
    slow: bool = False  # alive, but its latest polls got no answer in time (hung?)
    # Answering from a new process (another instance id), behind what the group
    # has: it lost its state when it restarted.
    restarted: bool = False
    # for a primary: the backups' addresses it counts as holding every update
    in_sync: tuple[str, ...] = ()


@dataclass(frozen=True)
class Promote:
    node_id: str
    address: str
    epoch: int
    backups: tuple[str, ...]


@dataclass(frozen=True)
class AddBackup:
    """Configure ``address`` as a backup under ``epoch``, then give the primary its new list."""

    primary_address: str
    address: str
    epoch: int
    backups: tuple[str, ...]  # the primary's full backup list afterwards


@dataclass(frozen=True)
class DropBackups:
    """Give the primary a backup list without the quarantined replicas."""

    primary_address: str
    epoch: int
    backups: tuple[str, ...]


@dataclass(frozen=True)
class GroupLost:
    """The primary is dead and no live replica can take over."""

    reason: str


Decision = Promote | AddBackup | DropBackups | GroupLost


def progress_key(replica: ReplicaView) -> tuple[int, int, str]:
    """Most applied updates first, then the higher epoch, then node id (deterministic)."""
    return (sum(replica.versions.values()), replica.epoch, replica.node_id)


def behind(versions: dict[str, int], others: Sequence[dict[str, int]]) -> bool:
    """Whether a replica holding ``versions`` (job id -> applied version) lacks a job,
    or a version of one, that any of ``others`` has."""
    return any(versions.get(job, -1) < v for other in others for job, v in other.items())


def live_primary(
    group: Sequence[ReplicaView],
    recorded_epoch: int = 0,
    recorded_id: str = "",
    committed: frozenset[str] = frozenset(),
) -> ReplicaView | None:
    """The live replica claiming primary at the group's newest epoch, if any.

    The newest epoch is the highest any replica of the group reported (dead ones
    included) or the one recorded for the group (``recorded_epoch``, from the store:
    it outlives a leader's polls). A claim under a lower epoch is stale: an old
    primary back from a partition that nobody told it was replaced. It never
    counts as the primary (it would serve the state it had when it was cut off);
    it is a replica like a spare, made a backup of the real primary when one is
    added.

    A claim by another node than the recorded primary (``recorded_id``) counts only
    when that replica holds every job with committed steps on the group
    (``committed``), whatever its epoch. A coordinator records its promotions (of a
    backup that holds the group's jobs), so such a claim comes from a fresh replica
    started as primary, or from a replica promoted by hand (``stalwart ps promote``,
    a bare ``Promote`` call); adopting one that lacks a job would stall that job for
    good (its trainers cannot register state the group already committed). Its epoch
    does not make the recorded primary's claim stale either. With nothing committed,
    or no primary recorded yet, any claim counts.
    The recorded primary's own claim counts unless it comes from a new process
    of that node behind what the group has (``restarted``: its supervisor
    restarted it empty before it was found dead). Its jobs alone cannot tell:
    while a restore loads a checkpoint onto the recorded primary, it holds the
    job only once the load is done."""

    # While the recorded primary serves, what it holds counts too: the models of
    # finished jobs it keeps for export (none is committed any more, and a stray
    # seen just after a job ended took the group and them with it).
    serving = [r for r in group if r.node_id == recorded_id and r.alive and r.role == "primary"]
    held = set(committed).union(*(r.versions.keys() for r in serving if not r.restarted))

    def may_serve(r: ReplicaView) -> bool:
        return not recorded_id or r.node_id == recorded_id or held <= r.versions.keys()

    claims = [r for r in group if r.alive and r.role == "primary" and not r.restarted]
    empty = {r.node_id for r in claims if not may_serve(r)}
    newest = max([recorded_epoch, *(r.epoch for r in group if r.node_id not in empty)])
    primaries = [r for r in claims if r.node_id not in empty and r.epoch >= newest]
    # at one epoch, the recorded primary before a newcomer claiming the same (a fresh
    # replica started as primary while the group has no committed job)
    return max(primaries, key=lambda r: (r.epoch, r.node_id == recorded_id), default=None)


def decide(
    group: Sequence[ReplicaView],
    primary_id: str,
    committed: frozenset[str] = frozenset(),
    wanted: int = 0,
    recorded_epoch: int = 0,
) -> list[Decision]:
    """What to do for one shard group whose recorded primary is ``primary_id`` (at
    ``recorded_epoch``); ``committed``: jobs with committed steps on this group (their
    state exists); ``wanted``: backups the primary should have (0: every live replica)."""
    primary = live_primary(group, recorded_epoch, primary_id, committed)
    if primary is not None:
        if _stray_above(group, primary):
            return [_above_stray(group, primary, recorded_epoch)]
        return list(_add_backups(group, primary, wanted))
    recorded = next((r for r in group if r.node_id == primary_id), None)
    if (
        recorded is not None
        and recorded.alive
        and not recorded.restarted
        # Fenced, it serves nothing until configured again: a backup was moved to a
        # higher epoch under it (by hand: `stalwart ps promote -b BACKUP` of another
        # replica), and waiting for it stalled the group for good.
        and recorded.role != "fenced"
    ):
        return []  # recorded primary alive but not (yet) polled as primary: wait
    if not primary_id:
        return []  # no primary known yet (replicas still starting): never promote blindly
    return [choose_promotion(group, committed, recorded_epoch)]


def next_epoch(group: Sequence[ReplicaView], recorded_epoch: int = 0) -> int:
    """The epoch a promotion or restore configures: above every epoch seen in the
    group, dead replicas and the recorded one included, so that every older claim
    (an old primary back from a partition, a stray) is fenced by it."""
    return max([recorded_epoch, *(r.epoch for r in group)]) + 1


def _stray_above(group: Sequence[ReplicaView], primary: ReplicaView) -> bool:
    """Whether a live claim to primary above ``primary``'s epoch did not count (it lacks
    the group's jobs: see :func:`live_primary`)."""
    return any(r.alive and r.role == "primary" and r.epoch > primary.epoch for r in group)


def _above_stray(
    group: Sequence[ReplicaView], primary: ReplicaView, recorded_epoch: int = 0
) -> Promote:
    """The primary promoted again, above every epoch in the group, with its backups.

    A client searching for the primary takes the highest epoch that claims it (and
    would not go back to a lower one), so while a stray claims a higher epoch a
    trainer that searched, or an export, went to the stray and found no job. Above it,
    the stray's claim is stale, as an old primary's is: a spare until one is needed.
    """
    return Promote(
        primary.node_id, primary.address, next_epoch(group, recorded_epoch), primary.backups
    )


def choose_promotion(
    group: Sequence[ReplicaView], committed: frozenset[str] = frozenset(), recorded_epoch: int = 0
) -> Promote | GroupLost:
    candidates = [r for r in group if r.alive and r.role == "backup"]
    # A backup that holds none of the jobs the group served (a fresh replica
    # started after every old one died) must not become primary: it would
    # serve empty state. The group is lost; a checkpoint restore handles it.
    # What the dead replicas held is known from polls only to the leader that
    # made them; jobs with committed steps are known from the stored jobs, so a
    # leader elected after the deaths still knows the group served them.
    served = {j for r in group if not r.alive for j in r.versions} | set(committed)
    if served:
        candidates = [r for r in candidates if served & set(r.versions)]
    # A replica the dead primary no longer replicated to (a hung backup replaced by
    # a spare) holds stale state: only the ones it replicated to may take over.
    last = [r for r in group if not r.alive and r.role == "primary" and r.backups]
    if last:
        followers = set(max(last, key=lambda r: r.epoch).backups)
        candidates = [r for r in candidates if r.address in followers]
    if not candidates:
        return GroupLost("primary dead and no live backup")
    best = max(candidates, key=progress_key)
    backups = tuple(sorted(r.address for r in candidates if r.node_id != best.node_id))
    return Promote(best.node_id, best.address, next_epoch(group, recorded_epoch), backups)


def _add_backups(
    group: Sequence[ReplicaView], primary: ReplicaView, wanted: int = 0
) -> list[Decision]:
    # Quarantined backups leave the list; unconfigured ones leave it and come back
    # as spares below, so the primary opens a new link and installs their state.
    banned = {r.address for r in group if r.quarantined}
    banned |= {r.address for r in _unconfigured(group, primary)}
    current = [a for a in primary.backups if a not in banned]
    out: list[Decision] = []
    if len(current) < len(primary.backups):
        out.append(DropBackups(primary.address, primary.epoch, tuple(current)))
    spares = [
        r for r in sorted(group, key=lambda r: r.node_id)
        if r.alive and not r.slow and r.node_id != primary.node_id and r.address not in current
        and r.role in ("backup", "fenced", "primary")  # not polled yet: add it once it answers
    ]  # fmt: skip
    if wanted > 0:
        # keep the backups that answer; a spare takes the place of each that does not
        views = {r.address: r for r in group}
        healthy = [a for a in current if a in views and views[a].alive and not views[a].slow]
        spares = spares[: max(0, wanted - len(healthy))]
        current = healthy
    for r in spares:
        current.append(r.address)
        out.append(AddBackup(primary.address, r.address, primary.epoch, tuple(current)))
    return out


def _unconfigured(group: Sequence[ReplicaView], primary: ReplicaView) -> list[ReplicaView]:
    """Listed backups that restarted. While the primary counts one in sync, its link
    still counts the jobs the old process held, so nothing is installed on it until
    a commit fails there (never, while the job is idle); once re-added, the new
    link is out of sync until the install is done, so it is not re-added again
    meanwhile. One restarted with its start-up flags (a lower epoch, or primary)
    also refuses the primary's replication and, listed already, would never be
    configured again."""
    return [
        r for r in group
        if r.address in primary.backups and r.alive and not r.slow and r.role
        and ((r.restarted and r.address in primary.in_sync) or r.epoch < primary.epoch
             or (r.epoch == primary.epoch and r.role != "backup"))
    ]  # fmt: skip
