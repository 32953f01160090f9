"""Checkpoint decisions of the leader: when to order the next one, what to call it,
and where a restore loads. Pure: fed numbers and the last polled replica views.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from services.coordinator.promotion import ReplicaView, live_primary, next_epoch

_POLLED = ("primary", "backup", "fenced")


@dataclass(frozen=True)
class Order:
    """A periodic checkpoint to take: snapshot at version ``at``. ``passed`` counts the
    multiples of the interval the job went past with no checkpoint since the last one
    (0 for an order at the next multiple); this checkpoint is the one that covers them."""

    at: int
    passed: int = 0


def next_order(
    current: int,
    interval: int,
    steps: int,
    last_saved: int,
    last_failed: int = -1,
    stalled: bool = False,
) -> Order | None:
    """The next periodic checkpoint of a job with ``checkpoint_interval = interval``.

    ``current``: the version its primaries hold now; ``last_saved``: the version of its
    newest checkpoint (-1 or 0: none); ``last_failed``: the version of the last order
    that failed for a reason other than being overtaken (-1: none); ``stalled``: the
    version has not moved since the leader last looked. A checkpoint is due at every
    multiple of the interval (a mark):

    - the first mark above ``last_saved`` not reached yet: order it (the primaries
      snapshot when they get there);
    - that mark already passed with no checkpoint (the job outran the last save):
      order the newest version the primaries can still snapshot, ``current + 1``
      (``current`` itself at the last step, which nothing moves past). Strictly
      above otherwise: in sync mode nothing holds training while the order travels,
      and the paramserver refuses a version it is already past;
    - that mark passed and the job stalled (a hung trainer, a slot waiting for a
      replacement): ``current`` itself, which the primaries hold now. ``current + 1``
      might never come, and a job that hangs is the one that most needs its newest
      checkpoint. Not again after an order at ``current`` itself failed;
    - after a failed order at or beyond that mark (store full or down, replicas that
      disagree), the first mark above both ``current`` and the failed one: a failing
      store is tried once an interval, not every tick.

    None when the interval is 0 or the order would lie past the job's last step.
    """
    if interval <= 0:
        return None
    covered = max(last_saved, 0) // interval  # marks up to here have a checkpoint
    due = (covered + 1) * interval
    passed = max(0, current // interval - covered)
    if stalled and due <= current and last_failed != current:
        at = current
    elif last_failed >= due:
        at = (max(current, last_failed) // interval + 1) * interval
    elif due > current:
        at = due
    else:
        at = current if current >= steps else current + 1
    return Order(at, passed) if at <= steps else None


def job_version(versions: Sequence[int | None], highest: bool = False) -> int | None:
    """A job's version over the answers of its shard primaries (``None``: that primary
    does not hold the job). ``None`` while any primary does not hold it yet: a new job's
    model has not reached every paramserver, which is waited for, not a failed order.
    The lowest version otherwise (what every shard can snapshot), or the highest."""
    if not versions or any(v is None for v in versions):
        return None
    return max(versions) if highest else min(versions)


def checkpoint_id(job_id: str, step: int) -> str:
    """Unique across jobs and re-saves of one step (a restore rewinds and training
    passes the same steps again); sorts by step as text within a job."""
    return f"{job_id}.s{step:012d}.{uuid.uuid4().hex[:6]}"


def job_of(checkpoint_id: str) -> str:
    """The job a checkpoint id made by :func:`checkpoint_id` belongs to ("" if not one)."""
    parts = checkpoint_id.rsplit(".", 2)
    return parts[0] if len(parts) == 3 and parts[1].startswith("s") else ""


@dataclass(frozen=True)
class RestoreTarget:
    """Load the checkpoint on ``node_id`` after promoting it to primary under ``epoch``."""

    node_id: str
    address: str
    epoch: int
    backups: tuple[str, ...]


def restore_target(group: Sequence[ReplicaView], recorded_epoch: int = 0) -> RestoreTarget | None:
    """Where one shard group's part of a checkpoint is loaded.

    The live primary when there is one (restore on command), else the most
    advanced live replica that answered a poll (fresh replicas after the group
    was lost). The epoch is above every epoch seen in the group, dead replicas
    and the recorded one included, so clients and old replicas of the lost
    group are fenced by it. None while no live replica has answered yet.
    """
    live = [r for r in group if r.alive and r.role in _POLLED]
    if not live:
        return None
    chosen = live_primary(group, recorded_epoch) or max(live, key=lambda r: (r.epoch, r.node_id))
    backups = tuple(sorted(r.address for r in live if r.node_id != chosen.node_id))
    return RestoreTarget(chosen.node_id, chosen.address, next_epoch(group, recorded_epoch), backups)
