"""A job's metric history on one replica: per-slot training losses and evaluations.

Plain data, no gRPC or torch: the servicer feeds it what pushes and
RecordEvaluation calls carry, and ListJobMetrics reads pages of it.

Bounded: the newest ``MAX_RECORDS`` records per job are kept and older ones
are dropped from the front (counted in ``dropped``). A full history of losses
takes 7.6 MB (docs/models.md, "Evaluation and metrics"). Each record is keyed
by what it describes ((step, slot) for a loss, version for an evaluation) and
recorded once: a retried or recomputed push, or an evaluation reported twice,
changes nothing.
"""

from __future__ import annotations

import collections
import itertools
import math
import secrets
import time
from dataclasses import dataclass

MAX_RECORDS = 20_000
MAX_METRICS = 16  # names per evaluation: bounds every Prometheus label set too
MAX_METRIC_NAME = 64

LOSS = "loss"
EVAL = "eval"


@dataclass(frozen=True, slots=True)  # slots: 7.6 MB for a full history instead of 8.5
class Record:
    sequence: int
    time: float
    kind: str  # LOSS or EVAL
    step: int  # a loss's step, an evaluation's version
    slot: int  # -1 for an evaluation
    loss: float = 0.0
    metrics: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Summary:
    history_id: str
    last_sequence: int
    latest_step: int
    latest_loss: float
    loss_slots: int
    last_evaluation: Record | None
    dropped: int


def check_evaluation(version: int, metrics: dict[str, float]) -> str:
    """Why an evaluation cannot be recorded, or "" when it can."""
    if version < 0:
        return f"version must be >= 0, got {version}"
    if not metrics:
        return "an evaluation needs at least one metric"
    if len(metrics) > MAX_METRICS:
        return f"at most {MAX_METRICS} metrics per evaluation, got {len(metrics)}"
    for name, value in metrics.items():
        if not name or len(name) > MAX_METRIC_NAME:
            return f"metric names must be 1-{MAX_METRIC_NAME} characters, got {name[:80]!r}"
        if not math.isfinite(value):
            return f"metric {name!r} is not finite ({value})"
    return ""


class History:
    """The bounded, de-duplicated metric records of one job."""

    def __init__(self, max_records: int = MAX_RECORDS, clock=time.time):
        self.history_id = secrets.token_hex(6)
        self.max_records = max_records
        self._clock = clock
        self._records: collections.deque[Record] = collections.deque()
        self._keys: set[tuple] = set()
        self._next = 1
        self.dropped = 0
        # the latest step's losses so far: (step, sum, count), and the best evaluation
        self._latest = (-1, 0.0, 0)
        self._last_eval: Record | None = None

    def __len__(self) -> int:
        return len(self._records)

    def record_loss(self, step: int, slot: int, loss: float) -> bool:
        """Keep one slot's loss for a step; False when it was already kept."""
        if not math.isfinite(loss) or not self._add(
            (LOSS, step, slot), LOSS, step, slot, loss=loss
        ):
            return False
        latest, total, count = self._latest
        if step > latest:
            self._latest = (step, loss, 1)
        elif step == latest:
            self._latest = (step, total + loss, count + 1)
        return True

    def record_evaluation(self, version: int, metrics: dict[str, float]) -> bool:
        """Keep an evaluation of ``version``; False when that version already has one."""
        shown = tuple(sorted(metrics.items()))
        if not self._add((EVAL, version), EVAL, version, -1, metrics=shown):
            return False
        record = self._records[-1]
        if self._last_eval is None or version > self._last_eval.step:
            self._last_eval = record
        return True

    def _add(self, key: tuple, kind: str, step: int, slot: int, **values) -> bool:
        if key in self._keys:
            return False
        self._keys.add(key)
        self._records.append(Record(self._next, self._clock(), kind, step, slot, **values))
        self._next += 1
        while len(self._records) > self.max_records:
            old = self._records.popleft()
            self._keys.discard(_key(old))
            self.dropped += 1
        return True

    def last(self) -> Record | None:
        return self._records[-1] if self._records else None

    def after(self, sequence: int, limit: int) -> tuple[list[Record], bool]:
        """Up to ``limit`` records with a higher sequence, oldest first, and whether
        more follow them."""
        if not self._records:
            return [], False
        # sequences are contiguous from the oldest kept: index arithmetic, no search
        start = max(sequence + 1 - self._records[0].sequence, 0)
        page = list(itertools.islice(self._records, start, start + limit + 1))
        return page[:limit], len(page) > limit

    def summary(self) -> Summary:
        step, total, count = self._latest
        return Summary(
            history_id=self.history_id,
            last_sequence=self._next - 1,
            latest_step=max(step, 0),
            latest_loss=total / count if count else 0.0,
            loss_slots=count,
            last_evaluation=self._last_eval,
            dropped=self.dropped,
        )


def _key(record: Record) -> tuple:
    return (LOSS, record.step, record.slot) if record.kind == LOSS else (EVAL, record.step)
