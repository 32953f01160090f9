"""The job state machine: an enum of states, one small class of data per state.

    PENDING --(every slot has a trainer)--> RUNNING --(version reaches steps)--> SUCCEEDED
       |                                       |
       +--------(cancel / fail)----------------+--> CANCELLED / FAILED

Terminal states absorb every later event (cancelling a finished job changes
nothing). A RUNNING job that loses a trainer stays RUNNING: its slot goes to a
standby or a free trainer, and failing those to one of the job's own trainers,
which computes it beside its own (placement.py, elastic.py); only a job left
with no trainer at all waits, and the paramserver simply does not advance.
Plain code, fed events with the time passed in; no I/O.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class JobState(enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})


@dataclass(frozen=True)
class Pending:
    since: float
    state = JobState.PENDING
    reason = "waiting for trainers"


@dataclass(frozen=True)
class Running:
    started_at: float
    state = JobState.RUNNING
    reason = "training"


@dataclass(frozen=True)
class Succeeded:
    finished_at: float
    step: int
    state = JobState.SUCCEEDED

    @property
    def reason(self) -> str:
        return f"reached step {self.step}"


@dataclass(frozen=True)
class Failed:
    finished_at: float
    reason: str
    state = JobState.FAILED


@dataclass(frozen=True)
class Cancelled:
    finished_at: float
    reason: str
    state = JobState.CANCELLED


Status = Pending | Running | Succeeded | Failed | Cancelled


@dataclass
class Slot:
    """A data-parallel position; its data is a function of (seed, slot, step)."""

    index: int
    node_id: str = ""  # empty while unassigned


@dataclass
class Job:
    """A job as the coordinator tracks it. ``spec`` is opaque here (the wire spec)."""

    job_id: str
    num_slots: int
    steps: int
    created_at: float
    spec: Any = None
    num_shards: int = 1
    status: Status = field(default=None)  # type: ignore[assignment]
    step: int = 0  # steps committed (the paramserver version in sync mode)
    slots: list[Slot] = field(default_factory=list)
    standbys: list[str] = field(default_factory=list)  # warm standby node ids
    updated_at: float = 0.0

    def __post_init__(self) -> None:
        if self.status is None:
            self.status = Pending(self.created_at)
        if not self.slots:
            self.slots = [Slot(i) for i in range(self.num_slots)]
        self.updated_at = self.updated_at or self.created_at

    @property
    def state(self) -> JobState:
        return self.status.state

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL

    def holders(self) -> list[str]:
        """The nodes the job holds: its slots' trainers, then its standbys."""
        return [s.node_id for s in self.slots if s.node_id] + list(self.standbys)

    def holder_of(self, node_id: str) -> Slot | None:
        return next((s for s in self.slots if s.node_id == node_id), None)

    def free_slots(self) -> list[Slot]:
        return [s for s in self.slots if not s.node_id]


# --- events ----------------------------------------------------------------------


@dataclass(frozen=True)
class SlotsChanged:
    """Placement changed who holds which slot."""


@dataclass(frozen=True)
class Progress:
    """The paramserver's version for the job (steps committed)."""

    version: int


@dataclass(frozen=True)
class Cancel:
    reason: str


@dataclass(frozen=True)
class Fail:
    reason: str


@dataclass(frozen=True)
class Rewind:
    """The job's state was restored from a checkpoint of ``step``: training goes on
    from there (in sync mode the step is the paramserver version)."""

    step: int


Event = SlotsChanged | Progress | Cancel | Fail | Rewind


@dataclass(frozen=True)
class Transition:
    """The job moved from one state to another (the caller persists and announces it)."""

    job_id: str
    old: JobState
    new: JobState
    reason: str


def advance(job: Job, event: Event, now: float) -> Transition | None:
    """Feed one event; returns the state change it caused, if any."""
    if job.finished:
        return None  # terminal states absorb everything
    old = job.state
    new_status = _next_status(job, event, now)
    if isinstance(event, Progress) and event.version > job.step:
        job.step = event.version
        job.updated_at = now
    if isinstance(event, Rewind):
        job.step = event.step
        job.updated_at = now
    if new_status is None:
        return None
    job.status = new_status
    job.updated_at = now
    return Transition(job.job_id, old, new_status.state, new_status.reason)


def _next_status(job: Job, event: Event, now: float) -> Status | None:
    match event:
        case Cancel(reason):
            return Cancelled(now, reason or "cancelled")
        case Fail(reason):
            return Failed(now, reason)
        case Progress(version) if version >= job.steps:
            return Succeeded(now, version)
        case SlotsChanged() | Progress() if job.state is JobState.PENDING and not job.free_slots():
            return Running(now)
    return None
