"""Checkpoint decisions of the leader: when to order the next one, what to call it,
and where a restore loads. Pure: fed numbers and the last polled replica views.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from services.coordinator.promotion import ReplicaView, live_primary

_POLLED = ("primary", "backup", "fenced")


def next_version(current: int, interval: int, last_ordered: int) -> int | None:
    """The version the next periodic checkpoint snapshots at: the first multiple of
    ``interval`` above both the version the primaries report now and the last one
    ordered. Strictly above: the paramserver refuses a version it is already past,
    and in sync mode nothing holds training while the order travels."""
    if interval <= 0:
        return None
    return (max(current, last_ordered) // interval + 1) * interval


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
    chosen = live_primary(group) or max(live, key=lambda r: (r.epoch, r.node_id))
    epoch = max([recorded_epoch, *(r.epoch for r in group)]) + 1
    backups = tuple(sorted(r.address for r in live if r.node_id != chosen.node_id))
    return RestoreTarget(chosen.node_id, chosen.address, epoch, backups)
