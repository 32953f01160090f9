"""Paramserver replica fingerprints compared at a checkpoint's version. Pure.

Replicas of a shard group apply the same commits with the same arithmetic, so
at one version their state is bitwise equal and so are their CRC32C
fingerprints. A difference is silent corruption of one replica's memory (or of
its arithmetic). The vote:

- all agree: publish the checkpoint;
- a strict majority agrees: the replicas outside it are quarantined; the
  checkpoint is published only if the primary (whose snapshot it is) is in the
  majority — otherwise a majority backup takes over (quarantine moves the
  primary out) and the next checkpoint is taken from it;
- no majority (typically a primary and one backup that disagree): nobody can
  say which copy is right, so the checkpoint is not published and the job goes
  back to its newest checkpoint whose replicas agreed, recomputing the steps
  since (training is deterministic, so the result is unchanged).

Replicas that could not answer for exactly that version (behind, catching up,
unreachable) do not vote. Without the primary's answer, or with a single voter,
nothing is checked: the checkpoint is published as it would be without the
comparison, and the next checkpoint tries again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from services.coordinator.promotion import ReplicaView


@dataclass(frozen=True)
class Judgement:
    checked: bool  # enough replicas answered to compare
    agree: bool
    publish: bool  # the primary's snapshot can be trusted
    quarantine: tuple[str, ...] = ()  # node ids outvoted
    restore: bool = False  # no trustworthy copy: go back to the last agreed checkpoint
    voters: int = 0


def describe(prints: Mapping[str, int]) -> str:
    """One line naming every voter's fingerprint, for events, logs and alerts."""
    return ", ".join(f"{node}={crc:08x}" for node, crc in sorted(prints.items()))


def voters(group: Sequence[ReplicaView], primary_id: str, job_id: str) -> dict[str, str]:
    """node id -> address of the replicas asked to fingerprint ``job_id``: the group's
    primary and the backups it replicates to, live and holding the job. Any other
    replica (a warm spare, a backup replaced while it hung, an old primary back from
    a partition) holds no current state: asked for a version it never reaches, it
    would keep the checkpoint waiting for the whole deadline."""
    primary = next((r for r in group if r.node_id == primary_id), None)
    followers = set(primary.backups) if primary is not None else set()
    return {
        r.node_id: r.address
        for r in group
        if r.alive and job_id in r.versions
        and (r.node_id == primary_id or (r.role == "backup" and r.address in followers))
    }  # fmt: skip


def judge(primary_id: str, prints: Mapping[str, int]) -> Judgement:
    """``prints``: node id -> combined fingerprint of each replica that answered."""
    voters = len(prints)
    if voters < 2 or primary_id not in prints:
        return Judgement(checked=False, agree=True, publish=True, voters=voters)
    counts = Counter(prints.values())
    if len(counts) == 1:
        return Judgement(checked=True, agree=True, publish=True, voters=voters)
    winner, votes = counts.most_common(1)[0]
    if 2 * votes > voters:
        odd = tuple(sorted(n for n, crc in prints.items() if crc != winner))
        primary_ok = prints[primary_id] == winner
        return Judgement(
            checked=True, agree=False, publish=primary_ok, quarantine=odd, voters=voters
        )
    return Judgement(checked=True, agree=False, publish=False, restore=True, voters=voters)
