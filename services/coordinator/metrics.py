"""The coordinator's Prometheus series (deploy/grafana/metrics.txt), defined once.

Leadership and membership are read when Prometheus scrapes (:func:`watch`).
Recoveries are read off the leader's event stream: :class:`RecoveryClock` is
plain code fed the events the leader publishes, and says which recovery each
one completes and how long it took from the fault's detection, so the series
count exactly what ``stalwart events`` and the demo report show. Labels take
closed sets of values, pre-filled so every series exists from the first scrape.

``stalwart_coordinator_recoveries_total`` is the cluster's count, kept in the
coordination store with the rest of the leader's state (``Control.recoveries``,
written in the same flush as the events that complete them): a new leader goes
on from the stored count, so a crashed leader takes none of it along. Only the
leader exports it (:class:`RecoveryCounts`); a standby exports no sample, so a
sum over the coordinators counts each recovery once, and the series of a
process only ever rises while it is exported. The duration histogram stays
per process (observed by the replica that did the work).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from services.coordinator.membership import NodeState, Role
from stalwart.api import common

if TYPE_CHECKING:
    from services.coordinator.control import Control

RECOVERY_KINDS = (
    "trainer_replaced",
    "replica_promoted",
    "leader_elected",
    "checkpoint_restored",
    "node_drained",
)
QUARANTINE_REASONS = ("crc", "abft", "fingerprint", "duplicate_compute", "nonfinite", "other")

IS_LEADER = Gauge(
    "stalwart_coordinator_is_leader", "1 on the replica holding the leader lease and acting on it."
)
EPOCH = Gauge(
    "stalwart_coordinator_epoch", "Coordinator epoch: the highest leader-lease fencing token seen."
)
LEADER_CHANGES = Counter(
    "stalwart_coordinator_leader_changes_seen_total",
    "Times this replica saw itself become leader or stop being leader.",
)
RECOVERY_SECONDS = Histogram(
    "stalwart_coordinator_recovery_seconds",
    "From the fault's detection (lease lapsed, node declared dead, drain asked) to "
    "work resumed (a replacement's first committed step, a promoted primary, a "
    "restored checkpoint, a drained node, a leader serving with the stored state).",
    ["kind"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)
QUARANTINES = Counter(
    "stalwart_coordinator_quarantines_total",
    "Nodes quarantined after corruption was detected, by what detected it.",
    ["reason"],
)

for _kind in RECOVERY_KINDS:
    RECOVERY_SECONDS.labels(_kind)
for _reason in QUARANTINE_REASONS:
    QUARANTINES.labels(_reason)


# --- recoveries from the event stream ---------------------------------------------


@dataclass(frozen=True)
class Recovered:
    """One finished recovery; ``seconds`` None when its duration is measured elsewhere
    (leader_elected: by the election, :func:`leader_elected`)."""

    kind: str
    seconds: float | None


@dataclass(frozen=True)
class Quarantined:
    reason: str


Outcome = Recovered | Quarantined

# Nodes remembered as dead or draining, at most: a dead node that never comes
# back is forgotten once this many newer ones were seen.
_REMEMBERED = 4096


def quarantine_reason(text: str) -> str:
    """The closed-set reason a quarantine's reason or message names."""
    text = text.lower()
    for needle, reason in (
        ("abft", "abft"),
        ("duplicate", "duplicate_compute"),
        ("fingerprint", "fingerprint"),
        ("crc", "crc"),
        ("finite", "nonfinite"),
        ("nan", "nonfinite"),
    ):
        if needle in text:
            return reason
    return "other"


def _seconds(event: common.Event) -> float:
    return event.time.seconds + event.time.nanos / 1e9


class RecoveryClock:
    """Turns the leader's events into finished recoveries and their durations.

    - trainer_replaced: a slot handed to a standby (or to a fresh node after its
      holder died); from the holder's death to the job's next committed step.
    - replica_promoted: from the old primary's death (the event's ``previous``
      attribute) to the promotion; the primary promoted again (above a stray's
      epoch) is none.
    - checkpoint_restored: from the shard group's loss to the restore.
    - node_drained: from the drain being asked (:meth:`drain_started`) to drained.
    - leader_elected: a leader's take-over at an epoch above 1 (the first leader a
      store ever had replaced nobody); timed by the election, not here.
    A start this leader did not see (it happened under the previous leader)
    counts from the recovery's own event.
    """

    def __init__(self) -> None:
        self.dead_at: dict[str, float] = {}  # node -> when declared dead
        self.drain_at: dict[str, float] = {}  # node -> when its drain was asked
        self.lost_at: dict[str, float] = {}  # job -> when a shard group of it was lost
        self.holders: dict[tuple[str, int], str] = {}  # (job, slot) -> node
        self.resuming: dict[str, list[float]] = {}  # job -> replacements awaiting a commit

    def drain_started(self, node_id: str, now: float) -> None:
        self.drain_at.setdefault(node_id, now)
        _bound(self.drain_at)

    def feed(self, events: Iterable[common.Event]) -> Iterator[Outcome]:
        for event in events:
            yield from self._one(event)

    def _one(self, e: common.Event) -> Iterator[Outcome]:
        t, k = _seconds(e), e.kind
        if k == common.EVENT_KIND_NODE_DEAD:
            if "shard" in e.attributes and e.job_id:  # a whole shard group lost
                self.lost_at.setdefault(e.job_id, t)
            elif e.node_id:
                self.dead_at[e.node_id] = t
                _bound(self.dead_at)
        elif k == common.EVENT_KIND_NODE_REGISTERED:
            self.dead_at.pop(e.node_id, None)
        elif k in (common.EVENT_KIND_STANDBY_PROMOTED, common.EVENT_KIND_SLOT_ASSIGNED):
            slot = int(e.attributes.get("slot", "-1"))
            if slot < 0:
                return  # a standby attached: nothing was lost
            previous = self.holders.get((e.job_id, slot))
            self.holders[(e.job_id, slot)] = e.node_id
            if k == common.EVENT_KIND_STANDBY_PROMOTED or previous in self.dead_at:
                start = self.dead_at.get(previous, self.drain_at.get(previous, t))
                self.resuming.setdefault(e.job_id, []).append(start)
        elif k == common.EVENT_KIND_STEP_COMMITTED:
            for start in self.resuming.pop(e.job_id, []):
                yield Recovered("trainer_replaced", max(0.0, t - start))
        elif k == common.EVENT_KIND_REPLICA_PROMOTED:
            previous = e.attributes.get("previous", "")
            if previous == e.node_id:
                return  # the primary promoted again above a stray claim: nothing was lost
            start = self.dead_at.get(previous, t)
            yield Recovered("replica_promoted", max(0.0, t - start))
        elif k == common.EVENT_KIND_CHECKPOINT_RESTORED:
            start = self.lost_at.pop(e.job_id, t)
            yield Recovered("checkpoint_restored", max(0.0, t - start))
        elif k == common.EVENT_KIND_NODE_DRAINED:
            start = self.drain_at.pop(e.node_id, t)
            yield Recovered("node_drained", max(0.0, t - start))
        elif k == common.EVENT_KIND_LEADER_ELECTED:
            if int(e.attributes.get("epoch", "0") or 0) > 1:
                yield Recovered("leader_elected", None)
        elif k == common.EVENT_KIND_NODE_QUARANTINED:
            yield Quarantined(quarantine_reason(e.attributes.get("reason", "") or e.message))
        elif k == common.EVENT_KIND_JOB_STATE_CHANGED and e.attributes.get("state") in (
            "succeeded",
            "failed",
            "cancelled",
        ):
            self.resuming.pop(e.job_id, None)  # no commit will come
            for key in [key for key in self.holders if key[0] == e.job_id]:
                del self.holders[key]


def _bound(d: dict) -> None:
    while len(d) > _REMEMBERED:
        del d[next(iter(d))]


CLOCK = RecoveryClock()


def outcomes(events: Iterable[common.Event]) -> list[Outcome]:
    """What the leader's events (about to be stored) say was recovered or quarantined."""
    return list(CLOCK.feed(events))


def counted(totals: dict[str, int], found: Iterable[Outcome]) -> dict[str, int]:
    """The cluster's recovery counts ``totals`` plus the recoveries in ``found``."""
    out = dict(totals)
    for outcome in found:
        if isinstance(outcome, Recovered):
            out[outcome.kind] = out.get(outcome.kind, 0) + 1
    return out


def observe(found: Iterable[Outcome]) -> None:
    """This process's durations and quarantines, once the events are stored."""
    for outcome in found:
        if isinstance(outcome, Quarantined):
            QUARANTINES.labels(outcome.reason).inc()
        elif outcome.seconds is not None:
            RECOVERY_SECONDS.labels(outcome.kind).observe(outcome.seconds)


def drain_started(node_id: str) -> None:
    CLOCK.drain_started(node_id, time.time())


def drain_ended(node_id: str) -> None:
    """Undrained before or after it drained: a later drain is timed from its own start."""
    CLOCK.drain_at.pop(node_id, None)


def leader_elected(token: int, seconds: float) -> None:
    """A replica took the lease and serves with the stored state ``seconds`` after
    finding it free. The first leader a store ever had (token 1) replaced nobody.
    Counted from the take-over's LEADER_ELECTED event (:class:`RecoveryClock`)."""
    if token > 1:
        RECOVERY_SECONDS.labels("leader_elected").observe(seconds)


# --- read at scrape time -------------------------------------------------------------


class NodeCounts:
    """``stalwart_coordinator_nodes{role,state}``: registered nodes on the leader.

    Every (role, state) pair is exported, 0 on standbys (their view is stale), so
    a sum over coordinators counts each node once and no series comes and goes.
    """

    def __init__(self, control: Control) -> None:
        self.control = control

    def describe(self) -> list[GaugeMetricFamily]:
        return [self._family()]

    def collect(self) -> list[GaugeMetricFamily]:
        counts = {(r, s): 0 for r in Role for s in NodeState}
        if self.control.epoch:
            # copied in one C call under the GIL: the event loop may change the dict
            for node in list(self.control.members.nodes.values()):
                counts[(node.role, node.state)] += 1
        family = self._family()
        for (role, state), n in counts.items():
            family.add_metric([role.value, state.value], n)
        return [family]

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "stalwart_coordinator_nodes",
            "Registered nodes by role and lease state (on the leader; 0 on standbys).",
            labels=["role", "state"],
        )


class RecoveryCounts:
    """``stalwart_coordinator_recoveries_total{kind}``: the cluster's stored count,
    exported by the leader only (every kind, from 0); nothing on a standby."""

    def __init__(self, control: Control) -> None:
        self.control = control

    def describe(self) -> list[CounterMetricFamily]:
        return [self._family()]

    def collect(self) -> list[CounterMetricFamily]:
        family = self._family()
        if self.control.epoch:
            totals = dict(self.control.recoveries)  # replaced whole, never changed in place
            for kind in RECOVERY_KINDS:
                family.add_metric([kind], totals.get(kind, 0))
        return [family]

    @staticmethod
    def _family() -> CounterMetricFamily:
        return CounterMetricFamily(
            "stalwart_coordinator_recoveries",
            "Recoveries carried out in the cluster, by kind (counted when the work "
            "resumed; kept in the coordination store, so failovers lose none; on the "
            "leader only).",
            labels=["kind"],
        )


def watch(control: Control) -> None:
    """Read leadership and membership from ``control`` at every scrape (once per process)."""
    IS_LEADER.set_function(
        lambda: 1 if control.epoch and control.leader.acting(time.monotonic()) else 0
    )
    EPOCH.set_function(lambda: control.leader.epoch)
    REGISTRY.register(NodeCounts(control))
    REGISTRY.register(RecoveryCounts(control))
