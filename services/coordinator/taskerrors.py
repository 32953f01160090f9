"""When does an error in the job's own code fail the job? Pure: fed the trainers' reports.

A model that cannot be imported fails the job at once: every trainer runs the
same module, and nothing the platform does will change it. An error while
computing a step could also be one machine's fault (a broken driver, a bad
disk under the dataset), so one report only counts; the job fails when

- the same error (phase, type, message, user's file:line) comes from two
  different trainers at the same step, whichever slots they computed (a bug in
  ``loss`` hits every slot of the step alike), or
- one trainer reports it three times for the same slot and step (a job with
  one trainer and no standby has nobody else to ask).

An error a machine's device or memory raises (``usererrors.machine_fault``: a GPU out
of memory or broken, a host allocator out of memory) is that machine's as much as
the job's. While another trainer could take the reporter's work (``movable``), such
a report never fails the job by itself, at import either: the reporter is drained
instead (``Control.task_error``), its slots move, and the job fails only when a
second trainer reports the same error. Before, one trainer's full GPU failed the
job at its import, or after three tries at a step.

The leader keeps the counts of each active job in the coordination store too
(``entries``/``load``, key ``usererrors/<job>``), so a new leader goes on counting
where the old one stopped: two trainers' reports fail the job even when a
failover fell between them.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from stalwart import usererrors

REPEATS_ON_ONE_TRAINER = 3
REMEMBERED = 10_000  # (job, step, error) entries kept, oldest dropped first


@dataclass(frozen=True)
class TaskError:
    node_id: str
    slot: int
    step: int
    phase: str  # "import" | "step" (stalwart.usererrors)
    error_type: str
    message: str
    location: str = ""

    def signature(self) -> tuple[str, str, str, str]:
        return (self.phase, self.error_type, self.message, self.location)

    @property
    def machine_fault(self) -> bool:
        return usererrors.machine_fault(self.error_type, self.message)

    def describe(self) -> str:
        where = f" at {self.location}" if self.location else ""
        if self.phase == "import":
            return f"the model cannot be loaded: {self.error_type}: {self.message}{where}"
        return (
            f"user code failed at step {self.step} (slot {self.slot}): "
            f"{self.error_type}: {self.message}{where}"
        )


@dataclass
class _Seen:
    nodes: set[str] = field(default_factory=set)
    per_slot: dict[tuple[str, int], int] = field(default_factory=dict)  # (node, slot) -> reports


class TaskErrors:
    def __init__(self, repeats: int = REPEATS_ON_ONE_TRAINER, remembered: int = REMEMBERED):
        self.repeats = repeats
        self.remembered = remembered
        self._seen: OrderedDict[tuple, _Seen] = OrderedDict()

    def record(self, job_id: str, error: TaskError, movable: bool = False) -> str | None:
        """Count one report; the job's failure reason when it should fail now, else None.
        ``movable``: another trainer could take the reporter's work (see above)."""
        by_machine = error.machine_fault and movable
        if error.phase == "import" and not by_machine:
            return error.describe()
        key = (job_id, error.step, error.signature())
        seen = self._seen.get(key)
        if seen is None:
            seen = self._seen[key] = _Seen()
            while len(self._seen) > self.remembered:
                self._seen.popitem(last=False)
        seen.nodes.add(error.node_id)
        at = (error.node_id, error.slot)
        seen.per_slot[at] = seen.per_slot.get(at, 0) + 1
        if len(seen.nodes) >= 2:
            return error.describe() + f" (on {len(seen.nodes)} trainers)"
        if seen.per_slot[at] >= self.repeats and not by_machine:
            return error.describe() + f" ({seen.per_slot[at]} times on {error.node_id})"
        return None

    def forget(self, job_id: str) -> None:
        """The job finished: its counts are of no more use."""
        for key in [k for k in self._seen if k[0] == job_id]:
            del self._seen[key]

    def holds(self, job_id: str) -> bool:
        return any(k[0] == job_id for k in self._seen)

    def entries(self, job_id: str) -> list[dict]:
        """The job's counts as plain data (JSON-ready), oldest first."""
        return [
            {"step": step, "error": list(signature), "nodes": sorted(seen.nodes),
             "per_slot": [[node, slot, n] for (node, slot), n in sorted(seen.per_slot.items())]}
            for (job, step, signature), seen in self._seen.items()
            if job == job_id
        ]  # fmt: skip

    def load(self, job_id: str, entries: list[dict]) -> None:
        """Take over the counts :meth:`entries` gave (another leader's)."""
        for e in entries:
            key = (job_id, int(e["step"]), tuple(str(x) for x in e["error"]))
            per_slot = {(str(node), int(slot)): int(n) for node, slot, n in e["per_slot"]}
            self._seen[key] = _Seen(set(map(str, e["nodes"])), per_slot)
        while len(self._seen) > self.remembered:
            self._seen.popitem(last=False)
