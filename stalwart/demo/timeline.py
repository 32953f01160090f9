"""From the coordinator's event stream and the kills we made, what happened when.

Plain code over plain records (no gRPC, no torch), so the rules are tested on
made-up event lists. The rules, per fault kind:

- ``trainer``: *detected* at the victim's NODE_DEAD; *acted* at the
  STANDBY_PROMOTED (or SLOT_ASSIGNED) that refills the slot; *resumed* at the
  commit of the step the newcomer computed first.
- ``paramserver``: detected at the victim's NODE_DEAD; acted at REPLICA_PROMOTED;
  resumed at the first STEP_COMMITTED after the promotion past the step the
  primary held when it was killed (``step_at_kill``, asked of the primary: the
  event stream trails the commits, and one it learns late is no recovery).
- ``coordinator``: detected and acted at the LEADER_ELECTED that follows the kill
  (the standby found the lease free); resumed at the first STEP_COMMITTED the new
  leader announces. Trainers and paramservers do not need the coordinator for
  steady-state steps, so training itself may never have stopped: ``steps_during``
  counts the steps committed between the kill and that announcement.

Steps are counted as the coordinator counts them: the job's step is the
paramserver version, the number of committed steps, and ``STEP_COMMITTED`` with
step v means the v-th step (index v-1) is in. A slot handed over at step v is
computed from version v, so its first commit is ``STEP_COMMITTED`` v+1.

Times are wall-clock seconds (the coordinator stamps events with ``time.time()``
on the same host as the kills).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Ev:
    """The parts of a ``common.Event`` the report needs; ``kind`` without its prefix."""

    sequence: int
    kind: str  # e.g. "STEP_COMMITTED", "NODE_DEAD"
    time: float
    job_id: str = ""
    node_id: str = ""
    step: int = 0
    message: str = ""


@dataclass
class Fault:
    """One kill -9 we made."""

    kind: str  # trainer | paramserver | coordinator
    target: str  # member name (= node id)
    killed_at: float
    step_at_kill: int  # the job's step (steps committed) when the kill was made


@dataclass
class Recovery:
    """What the events say about one fault. ``None`` where the event never came."""

    fault: Fault
    detected_at: float | None = None
    detected_by: str = ""
    acted_at: float | None = None
    action: str = ""
    resumed_at: float | None = None
    resumed_step: int | None = None
    steps_during: int = 0  # steps committed between the kill and the resume
    # The job's last step was committed before the kill: nothing was left to resume
    # (a kill aimed near the end can land after it on a loaded machine).
    after_end: bool = False

    @property
    def detection_s(self) -> float | None:
        return None if self.detected_at is None else self.detected_at - self.fault.killed_at

    @property
    def recovery_s(self) -> float | None:
        return None if self.resumed_at is None else self.resumed_at - self.fault.killed_at

    def to_dict(self, t0: float = 0.0) -> dict:
        """JSON-ready; absolute times as seconds since ``t0``."""

        def rel(t: float | None) -> float | None:
            return None if t is None else round(t - t0, 3)

        def dur(s: float | None) -> float | None:
            return None if s is None else round(s, 3)

        return {
            "kind": self.fault.kind,
            "target": self.fault.target,
            "killed_at_s": rel(self.fault.killed_at),
            "step_at_kill": self.fault.step_at_kill,
            "detected_at_s": rel(self.detected_at),
            "detected_by": self.detected_by,
            "detection_s": dur(self.detection_s),
            "action": self.action,
            "acted_at_s": rel(self.acted_at),
            "resumed_at_s": rel(self.resumed_at),
            "resumed_step": self.resumed_step,
            "recovery_s": dur(self.recovery_s),
            "steps_during": self.steps_during,
            "after_end": self.after_end,
        }


def recover(fault: Fault, events: Sequence[Ev], last_step: int | None = None) -> Recovery:
    """Apply the rules above to the events that came after the kill. ``last_step``:
    the job's final step, to tell a kill that came after it."""
    after = sorted((e for e in events if e.time >= fault.killed_at - 0.001), key=_seq)
    rec = Recovery(fault)
    rec.after_end = last_step is not None and any(
        e.kind == "STEP_COMMITTED" and e.step >= last_step and e.time < fault.killed_at
        for e in events
    )
    if fault.kind == "coordinator":
        elected = _first(after, "LEADER_ELECTED")
        if elected is not None:
            rec.detected_at = rec.acted_at = elected.time
            rec.detected_by = rec.action = elected.message
            _resume(rec, after, elected, min_step=0)
        return rec
    dead = _first(after, "NODE_DEAD", node_id=fault.target)
    if dead is None:
        return rec
    rec.detected_at, rec.detected_by = dead.time, dead.message
    later = [e for e in after if e.sequence > dead.sequence]
    if fault.kind == "trainer":
        act = _first(later, "STANDBY_PROMOTED") or _first(later, "SLOT_ASSIGNED", slot_only=True)
        min_step = act.step + 1 if act is not None else 0
    else:
        act = _first(later, "REPLICA_PROMOTED")
        min_step = rec.fault.step_at_kill + 1  # not a commit made before the kill
    if act is not None:
        rec.acted_at, rec.action = act.time, act.message
        _resume(rec, after, act, min_step)
    return rec


def _resume(rec: Recovery, after: Sequence[Ev], act: Ev, min_step: int) -> None:
    for e in after:
        if e.kind == "STEP_COMMITTED" and e.sequence > act.sequence and e.step >= min_step:
            rec.resumed_at, rec.resumed_step = e.time, e.step
            break
    if rec.resumed_step is not None:
        rec.steps_during = sum(
            1
            for e in after
            if e.kind == "STEP_COMMITTED" and rec.fault.step_at_kill < e.step < rec.resumed_step
        )


def _first(events: Iterable[Ev], kind: str, node_id: str = "", slot_only: bool = False):
    for e in events:
        if e.kind != kind or (node_id and e.node_id != node_id):
            continue
        if slot_only and "is a warm standby of" in e.message:
            continue  # a standby place, not a slot (a node may be named standby-1)
        return e
    return None


def _seq(e: Ev) -> int:
    return e.sequence


@dataclass
class StepAudit:
    """Which of steps 1..steps were announced (STEP_COMMITTED) never, or more than once.

    Announcements are at most once per step: a leader killed after storing the job
    but before its events leaves a gap. Lost or doubled updates show in the weights
    (the bitwise check), not here."""

    committed: int = 0
    missing: list[int] = field(default_factory=list)
    repeated: list[int] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def audit_steps(events: Iterable[Ev], job_id: str, steps: int) -> StepAudit:
    seen: dict[int, int] = {}
    for e in events:
        if e.kind == "STEP_COMMITTED" and e.job_id == job_id:
            seen[e.step] = seen.get(e.step, 0) + 1
    return StepAudit(
        committed=len(seen),
        missing=[s for s in range(1, steps + 1) if s not in seen],
        repeated=sorted(s for s, n in seen.items() if n > 1),
    )


def health_drain(
    events: Sequence[Ev], node: str, heat_from: int, crash_at: int, alive: bool | None
) -> dict:
    """Whether the heated trainer was drained on the health service's word before its
    scripted death: its NODE_DRAINED event (the reason the coordinator recorded), the
    last step committed when it came, and whether the process was still alive at the end
    (the death never fired: the trainer computed no step from crash_at on)."""
    drained = next((e for e in events if e.kind == "NODE_DRAINED" and e.node_id == node), None)
    at_step = None
    if drained is not None:
        done = [e.step for e in events if e.kind == "STEP_COMMITTED" and e.time <= drained.time]
        at_step = max(done, default=0)
    by_health = drained is not None and "health service" in drained.message
    return {
        "node": node,
        "heat_from_step": heat_from,
        "crash_at_step": crash_at,
        "drained": drained is not None,
        "drained_at_step": at_step,
        "drained_at": drained.time if drained is not None else None,
        "reason": drained.message if drained is not None else "",
        "crash_fired": alive is False,
        "ok": bool(by_health and at_step is not None and at_step < crash_at and alive),
    }
