"""Hung trainers and wedged primaries: a synchronous step that stands still.

A trainer can hang and go on heartbeating (a wedged device call, a deadlock in
the job's data loading, a read from a stalled network file system): its lease
never runs out, and the job waits for its slot for ever. The leader sees it in
what it polls anyway: the job's version has not moved for ``hung_step_seconds``
(or ten of its slowest holder's steps, if longer) while its primaries answer, and
each primary lists the slots whose push for that step arrived
(``ReplicaJob.pushed_slots``). The holders of the missing slots are drained with
that reason, so placement moves their slots to a standby or another trainer, as
for any drain; a push the hung process sends later is a duplicate of the new
holder's (pushes are keyed by step and slot).

Nothing is drained when no other trainer could take the work: that would only
turn a wait that may still end into a job with no trainer at all.

When every slot's push has arrived and the step still does not commit for as
long, the primary's commit path is wedged (its server answers, its job does not
move): its group fails over to a backup it replicated to, as if it had died.
Plain functions and one small tracker; ParamWatch calls them after each poll.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping
from dataclasses import dataclass

STEPS_OF_SLACK = 10  # a step may take this many of the slowest holder's usual steps


@dataclass(frozen=True)
class Hung:
    """Drain ``node_id``: it holds ``slots`` of ``job_id``, none pushed for ``step``."""

    node_id: str
    job_id: str
    step: int
    slots: tuple[int, ...]
    still_s: float

    @property
    def reason(self) -> str:
        which = ", ".join(str(s) for s in self.slots)
        noun = "slot" if len(self.slots) == 1 else "slots"
        return (f"hung: no push for {noun} {which} of {self.job_id} at step {self.step} "
                f"in {self.still_s:.0f}s")  # fmt: skip


def limit_s(hung_step_seconds: float, slowest_step_s: float) -> float:
    """How long a step may stand still before its missing slots' holders count as hung
    (0: never)."""
    if hung_step_seconds <= 0:
        return 0.0
    return max(hung_step_seconds, STEPS_OF_SLACK * slowest_step_s)


def hung_holders(
    job_id: str,
    step: int,
    still_s: float,
    limit: float,
    holders: Mapping[int, str],
    pushed: Collection[int],
    others: int,
) -> list[Hung]:
    """The holders to drain for one synchronous job whose ``step`` has stood still for
    ``still_s`` seconds: those of slots not in ``pushed`` (``holders``: slot -> node,
    unassigned slots absent), once ``limit`` is reached and while ``others`` live
    trainers outside them could take the slots."""
    if limit <= 0 or still_s < limit or others <= 0:
        return []
    missing: dict[str, list[int]] = {}
    for slot, node_id in sorted(holders.items()):
        if slot not in pushed:
            missing.setdefault(node_id, []).append(slot)
    return [Hung(n, job_id, step, tuple(slots), still_s) for n, slots in missing.items()]


def stuck_shards(
    still_s: float, limit: float, num_slots: int, pushed_by_shard: Mapping[int, Collection[int]]
) -> list[int]:
    """The shard groups whose primary holds every slot's push for the step and has not
    committed it for ``limit`` seconds (``pushed_by_shard``: shards at the job's step)."""
    if limit <= 0 or still_s < limit:
        return []
    every = set(range(num_slots))
    return sorted(k for k, pushed in pushed_by_shard.items() if every <= set(pushed))


class StillSince:
    """Since when each job's state (its step, slot holders and shard primaries, say)
    has been what it is, from the leader's polls. Any change counts as movement: a
    trainer that just took a drained one's slot, or a primary just promoted in a
    wedged one's place, gets a whole limit before it is judged."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[Hashable, float]] = {}

    def observe(self, job_id: str, state: Hashable, now: float) -> float:
        """Seconds ``job_id`` has been in ``state`` (0 when it just changed, or at first)."""
        seen = self._seen.get(job_id)
        if seen is None or seen[0] != state:
            self._seen[job_id] = (state, now)
            return 0.0
        return now - seen[1]

    def keep_only(self, job_ids: Collection[str]) -> None:
        for gone in self._seen.keys() - set(job_ids):
            del self._seen[gone]
