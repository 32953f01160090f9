"""Slot placement and warm-standby promotion: ``decide(jobs, nodes) -> list[Action]``.

Pure: it reads jobs and nodes and says what should change; ``apply`` makes the
change on the job objects, and the control loop persists and announces it.

Rules (docs/control-plane.md):
* only ALIVE trainers get work; a slot held by anything else is vacated;
* free slots go best first by (health score desc, EMA step time asc, node id);
  a RUNNING job takes its own warm standbys first (they already hold the
  weights), then free trainers, then spare standbys; a PENDING job takes free
  trainers first;
* elastic slots (services/coordinator/elastic.py): slots still free when the
  pool is empty go to the job's own trainers, the least loaded first, which
  compute them one after another; once idle trainers exist again, a trainer's
  extra slots move to them (after every job's free slots were served);
* trainers registered as standby that are free are attached to the active job
  with the fewest standbys;
* a finished job releases its trainers; a draining node left with no work is
  DRAINED.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from services.coordinator import drain, elastic
from services.coordinator.jobs import Job, JobState
from services.coordinator.membership import NodeRecord, NodeState, Role


@dataclass(frozen=True)
class Vacate:
    job_id: str
    slot: int
    node_id: str


@dataclass(frozen=True)
class DropStandby:
    job_id: str
    node_id: str


@dataclass(frozen=True)
class Assign:
    job_id: str
    slot: int
    node_id: str
    from_standby: bool  # a warm standby of this job was promoted into the slot
    beside: bool = False  # computed beside the node's other slots of the job (elastic)


@dataclass(frozen=True)
class AttachStandby:
    job_id: str
    node_id: str


@dataclass(frozen=True)
class Release:
    job_id: str
    node_id: str


@dataclass(frozen=True)
class MarkDrained:
    node_id: str


Action = Vacate | DropStandby | Assign | AttachStandby | Release | MarkDrained


def rank_key(node: NodeRecord) -> tuple[float, float, str]:
    """Best first: healthiest, then fastest (EMA step time), then node id."""
    return (-node.health_score, node.step_time_ema, node.node_id)


def decide(jobs: Sequence[Job], nodes: Iterable[NodeRecord]) -> list[Action]:
    nodes = list(nodes)
    eligible = {
        n.node_id: n for n in nodes if n.role is Role.TRAINER and n.state is NodeState.ALIVE
    }
    active = sorted((j for j in jobs if not j.finished), key=lambda j: (j.created_at, j.job_id))
    actions: list[Action] = list(_release_finished(jobs))
    busy: set[str] = set()
    for job in active:
        actions += _vacate_ineligible(job, eligible, busy)
    for job in active:
        actions += _fill_free_slots(job, eligible, busy, actions)
    for job in active:  # free slots of every job first, then extra slots
        actions += _spread_extras(job, eligible, busy, actions)
    for job in active:
        actions += _spill_free_slots(job, eligible, actions)
    actions += _attach_standbys(active, eligible, busy, actions)
    actions += _finish_drains(nodes, jobs, actions)
    return actions


def _release_finished(jobs: Sequence[Job]) -> Iterable[Action]:
    for job in jobs:
        if job.finished:
            yield from (Release(job.job_id, n) for n in job.holders())


def _vacate_ineligible(job: Job, eligible: dict, busy: set[str]) -> list[Action]:
    out: list[Action] = []
    for slot in job.slots:
        if slot.node_id and slot.node_id not in eligible:
            out.append(Vacate(job.job_id, slot.index, slot.node_id))
        elif slot.node_id:
            busy.add(slot.node_id)
    for node_id in job.standbys:
        if node_id in eligible:
            busy.add(node_id)
        else:
            out.append(DropStandby(job.job_id, node_id))
    return out


def _fill_free_slots(
    job: Job, eligible: dict, busy: set[str], so_far: list[Action]
) -> list[Action]:
    free = [slot for slot, node in _holders(job, so_far).items() if not node]
    return _give(job, free, _pool(job, eligible, busy, so_far), busy)


def _spread_extras(job: Job, eligible: dict, busy: set[str], so_far: list[Action]) -> list[Action]:
    """Idle trainers take the extra slots of trainers that hold several."""
    holders = _holders(job, so_far)
    extra = elastic.extras(holders, _rank_ids(eligible, holders))
    if not extra:
        return []
    return _give(job, extra, _pool(job, eligible, busy, so_far), busy)


def _spill_free_slots(job: Job, eligible: dict, so_far: list[Action]) -> list[Action]:
    """Slots no idle trainer took go to the job's own trainers (none: the job waits)."""
    holders = _holders(job, so_far)
    return [
        Assign(job.job_id, slot, node_id, from_standby=False, beside=True)
        for slot, node_id in elastic.spill(holders, _rank_ids(eligible, holders))
    ]


def _pool(job: Job, eligible: dict, busy: set[str], so_far: list[Action]) -> list[NodeRecord]:
    """Trainers that may take a slot of ``job``, in the order they take them: its
    standbys not given a slot this round yet (one given a free slot was offered
    again for an extra one, and held two while another standby stood idle)."""
    taken = {a.node_id for a in so_far if isinstance(a, Assign) and a.job_id == job.job_id}
    own = _ranked(eligible[n] for n in job.standbys if n in eligible and n not in taken)
    idle = _ranked(n for n in eligible.values() if n.node_id not in busy)
    workers = [n for n in idle if not n.standby]
    spares = [n for n in idle if n.standby]
    return own + workers + spares if job.state is JobState.RUNNING else workers + own + spares


def _give(job: Job, slots: list[int], pool: list[NodeRecord], busy: set[str]) -> list[Action]:
    out: list[Action] = []
    for slot, node in zip(slots, pool, strict=False):
        out.append(
            Assign(job.job_id, slot, node.node_id, from_standby=node.node_id in job.standbys)
        )
        busy.add(node.node_id)
    return out


def _holders(job: Job, so_far: list[Action]) -> dict[int, str]:
    """slot -> node id ("" free) of ``job`` once this round's actions are applied."""
    holders = {s.index: s.node_id for s in job.slots}
    for a in so_far:
        if isinstance(a, Vacate) and a.job_id == job.job_id:
            holders[a.slot] = ""
        elif isinstance(a, Assign) and a.job_id == job.job_id:
            holders[a.slot] = a.node_id
    return holders


def _rank_ids(eligible: dict, holders: dict[int, str]) -> list[str]:
    return [n.node_id for n in _ranked(eligible[n] for n in set(holders.values()) if n)]


def _attach_standbys(
    active: list[Job], eligible: dict, busy: set[str], so_far: list[Action]
) -> list[Action]:
    if not active:
        return []
    count = {j.job_id: len(j.standbys) for j in active}
    for a in so_far:  # standbys promoted or dropped this round no longer count
        if isinstance(a, DropStandby) or (isinstance(a, Assign) and a.from_standby):
            count[a.job_id] -= 1
    out: list[Action] = []
    for node in _ranked(n for n in eligible.values() if n.standby and n.node_id not in busy):
        job_id = min(count, key=lambda j: (count[j], _order(active, j)))
        out.append(AttachStandby(job_id, node.node_id))
        count[job_id] += 1
        busy.add(node.node_id)
    return out


def _finish_drains(
    nodes: list[NodeRecord], jobs: Sequence[Job], so_far: list[Action]
) -> list[Action]:
    working = _holders_after(jobs, so_far)
    return [
        MarkDrained(n.node_id)
        for n in sorted(nodes, key=lambda n: n.node_id)
        if drain.is_drained(n.state, n.node_id in working)
    ]


def _holders_after(jobs: Sequence[Job], actions: list[Action]) -> set[str]:
    """Node ids that hold a slot or standby place once ``actions`` are applied."""
    held = {s.node_id for j in jobs for s in j.slots if s.node_id} | {
        n for j in jobs for n in j.standbys
    }
    for a in actions:
        if isinstance(a, Vacate | DropStandby | Release):
            held.discard(a.node_id)
        elif isinstance(a, Assign | AttachStandby):
            held.add(a.node_id)
    return held


def _order(active: list[Job], job_id: str) -> int:
    return next(i for i, j in enumerate(active) if j.job_id == job_id)


def _ranked(nodes: Iterable[NodeRecord]) -> list[NodeRecord]:
    return sorted(nodes, key=rank_key)


def apply(jobs: dict[str, Job], actions: Iterable[Action]) -> set[str]:
    """Make the actions' changes on the jobs; returns the ids of jobs that changed."""
    changed: set[str] = set()
    for a in actions:
        if isinstance(a, MarkDrained):
            continue  # a node change: the caller updates membership
        job = jobs[a.job_id]
        changed.add(job.job_id)
        if isinstance(a, Vacate):
            job.slots[a.slot].node_id = ""
        elif isinstance(a, Assign):
            job.slots[a.slot].node_id = a.node_id
            if a.node_id in job.standbys:
                job.standbys.remove(a.node_id)
        elif isinstance(a, AttachStandby):
            job.standbys.append(a.node_id)
        elif isinstance(a, DropStandby | Release):
            _remove_node(job, a.node_id)
    return changed


def _remove_node(job: Job, node_id: str) -> None:
    if node_id in job.standbys:
        job.standbys.remove(node_id)
    for slot in job.slots:
        if slot.node_id == node_id:
            slot.node_id = ""
