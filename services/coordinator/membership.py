"""Node membership and leases: plain state fed (event, now), no I/O.

A node holds a lease renewed by heartbeats. How long it lasts is the
accrual detector's window for that node (services/coordinator/detector.py):
it grows when the node's beats arrive further apart, as on a loaded machine.
``expire(now)`` declares every node whose lease ran out DEAD and returns them,
so the caller can move their work and say so in the event stream. After a
leader change ``refresh_all(now)`` grants every live node a fresh window, with
the history forgotten (the old leader's arrivals are not known): a node must not
be declared dead only because the coordinator that would have heard its
heartbeats changed. For the same reason a coordinator that hears no node at all
declares none dead on silence (``expire``): it is the one cut off.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from services.coordinator.detector import ArrivalWindow, DetectorConfig

# Weight of the newest step time in the moving average: recent enough to notice
# a slowing node within a few steps, smooth enough to ignore one slow batch.
EMA_ALPHA = 0.3
MAX_STEP_TIME_S = 24 * 3600.0  # a step time reported above this is not believed


class NodeState(enum.Enum):
    ALIVE = "alive"
    DRAINING = "draining"
    DRAINED = "drained"
    DEAD = "dead"
    QUARANTINED = "quarantined"


class Role(enum.Enum):
    COORDINATOR = "coordinator"
    PARAMSERVER = "paramserver"
    TRAINER = "trainer"
    HEALTH = "health"
    AGENT = "agent"


# States whose lease is still watched (a draining node can still die). A quarantined
# node keeps heartbeating (it is told it has no work) rather than being forgotten.
LEASED = (NodeState.ALIVE, NodeState.DRAINING, NodeState.DRAINED, NodeState.QUARANTINED)


class UnknownNode(Exception):
    """Heartbeat from a node that is not registered or was declared dead."""


@dataclass
class NodeRecord:
    """What the coordinator knows of one registered process."""

    node_id: str
    role: Role
    address: str
    state: NodeState = NodeState.ALIVE
    lease_expires: float = 0.0
    last_heard: float = 0.0  # registration or the latest heartbeat
    standby: bool = False
    labels: dict[str, str] = field(default_factory=dict)
    shard: int = 0
    health_score: float = 1.0
    step_time_ema: float = 0.0
    last_step: int = -1
    registered_at: float = 0.0
    # Replica role of a paramserver as last polled ("primary", "backup", "fenced", "").
    replica_role: str = ""

    @property
    def leased(self) -> bool:
        return self.state in LEASED


class Membership:
    """Registered nodes and their leases."""

    def __init__(self, lease_s: float, detector: DetectorConfig | None = None) -> None:
        """``lease_s``: the least window; ``detector``: None for a fixed lease of lease_s."""
        self.lease_s = lease_s
        self.detector = detector or DetectorConfig.fixed(lease_s)
        self.nodes: dict[str, NodeRecord] = {}
        self._arrivals: dict[str, ArrivalWindow] = {}
        self._deaf = False  # expire() found nobody heard: refresh every window when heard again

    def _fresh(self, node: NodeRecord, now: float) -> None:
        """Start a node's arrival history at ``now``: it gets the initial window."""
        window = self._arrivals[node.node_id] = ArrivalWindow(self.detector, now)
        node.last_heard = now
        node.lease_expires = window.deadline()

    def window_s(self, node_id: str) -> float:
        """The silence after which ``node_id`` would be declared dead now."""
        window = self._arrivals.get(node_id)
        return window.window_s() if window is not None else self.detector.floor_s

    def phi(self, node_id: str, now: float) -> float:
        window = self._arrivals.get(node_id)
        return window.phi(now) if window is not None else 0.0

    def register(self, record: NodeRecord, now: float) -> NodeRecord:
        """Add or replace a node (a restarted node comes back fresh and ALIVE, unless it
        was quarantined: corruption is a property of the machine, not the process)."""
        old = self.nodes.get(record.node_id)
        quarantined = old is not None and old.state is NodeState.QUARANTINED
        record.state = NodeState.QUARANTINED if quarantined else NodeState.ALIVE
        self._fresh(record, now)
        record.registered_at = now
        self.nodes[record.node_id] = record
        return record

    def heartbeat(
        self, node_id: str, now: float, step: int = -1, step_time: float | None = None
    ) -> NodeRecord:
        """Renew a lease; raises UnknownNode for an absent or dead node."""
        node = self.nodes.get(node_id)
        if node is None or not node.leased:
            raise UnknownNode(node_id)
        window = self._arrivals.get(node_id)
        if window is None:
            self._fresh(node, now)
        else:
            window.heartbeat(now)
            node.last_heard = max(node.last_heard, now)
            node.lease_expires = window.deadline()
        # A trainer reports its last step's time with every beat: one sample per step,
        # and only a plausible one (an infinite time made the hung-step limit infinite
        # for good, and a new leader loaded it back from the store).
        if step > node.last_step and _plausible_step_time(step_time):
            node.step_time_ema = _ema(node.step_time_ema, step_time)
        node.last_step = max(node.last_step, step)
        return node

    def expire(self, now: float) -> list[NodeRecord]:
        """Declare DEAD every leased node whose lease has run out; return them.

        Not while this coordinator hears nobody: when two or more nodes hold leases and
        none has been heard for half the floor (7 beats by default), the
        silence is far more likely this coordinator's (its link cut, its process
        starved or paused) than every node's at once, and declaring them all dead
        would fail jobs that go on. When it hears again, every node gets a fresh
        window, as after a leader change. A crash is still found at once by the
        refused-connection probe, which does not go through here.
        """
        if self.hears_nobody(now):
            self._deaf = True
            return []
        if self._deaf:
            self._deaf = False
            self.refresh_all(now)
            return []
        dead = [n for n in self.nodes.values()
                if _may_die(n) and n.lease_expires <= now]  # fmt: skip
        for node in dead:
            node.state = NodeState.DEAD
        return sorted(dead, key=lambda n: n.node_id)

    def forget_dead(self, now: float, after_s: float, named: Callable[[], set[str]]) -> list[str]:
        """Remove the DEAD nodes whose lease ended ``after_s`` ago, except those
        ``named()`` returns (still named by a job or group; asked only when some node
        is due); return their ids. A quarantined node is never forgotten: corruption
        is a property of the machine."""
        due = [n.node_id for n in self.nodes.values()
               if n.state is NodeState.DEAD and n.lease_expires <= now - after_s]  # fmt: skip
        keep = named() if due else set()
        gone = sorted(n for n in due if n not in keep)
        for node_id in gone:
            del self.nodes[node_id]
            self._arrivals.pop(node_id, None)
        return gone

    def hears_nobody(self, now: float) -> bool:
        """Two or more nodes hold leases and not one was heard in half the floor."""
        leased = [n for n in self.nodes.values() if _may_die(n)]
        quiet_s = self.detector.floor_s / 2
        return len(leased) >= 2 and max(n.last_heard for n in leased) <= now - quiet_s

    def silent(self, now: float, after_s: float, role: Role) -> list[NodeRecord]:
        """Leased nodes of ``role`` not heard from for ``after_s`` (their lease still runs)."""
        return sorted(
            (n for n in self.nodes.values()
             if n.role is role and _may_die(n) and n.last_heard <= now - after_s),
            key=lambda n: n.node_id,
        )  # fmt: skip

    def declare_dead(self, node_id: str) -> NodeRecord | None:
        """Declare a node dead before its lease ends (it is known unreachable)."""
        node = self.nodes.get(node_id)
        if node is None or not _may_die(node):
            return None
        node.state = NodeState.DEAD
        return node

    def refresh_all(self, now: float) -> None:
        """Grant every leased node a full window (done by a newly elected leader)."""
        self._arrivals.clear()
        for node in self.nodes.values():
            if node.leased:
                self._fresh(node, now)

    def alive(self, role: Role | None = None) -> list[NodeRecord]:
        """Nodes still holding a lease (DRAINING and DRAINED included), by node id."""
        return sorted(
            (n for n in self.nodes.values() if n.leased and (role is None or n.role is role)),
            key=lambda n: n.node_id,
        )


def _may_die(node: NodeRecord) -> bool:
    """Whether a silent node is declared DEAD: a leased one, but not a quarantined one.
    Quarantine is a property of the machine, not of the process: once DEAD, the node
    registered again as ALIVE and was given work, and a new leader read it back DEAD.
    It holds no work, so its silence changes nothing; it stays QUARANTINED (never
    forgotten) until an operator releases it."""
    return node.leased and node.state is not NodeState.QUARANTINED


def _plausible_step_time(seconds: float | None) -> bool:
    return seconds is not None and 0 < seconds <= MAX_STEP_TIME_S  # NaN: False


def _ema(previous: float, sample: float) -> float:
    if previous <= 0:
        return sample
    return (1 - EMA_ALPHA) * previous + EMA_ALPHA * sample
