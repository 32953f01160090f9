"""Leader election state: plain code fed lease outcomes and the clock.

The store lease ``coordinator/leader`` elects the leader; its fencing token is
the coordinator epoch. The holder string ``<node_id>@<address>`` tells
everyone where the leader is.

The one safety rule: a leader acts only while ``now < acting_until``, where
``acting_until`` is the local (monotonic) time at which its last successful
acquire/renew *started* plus the TTL minus a margin. The store measures the
lease from no earlier than that moment, so this replica stops acting before
anyone else can acquire the lease, even if it was frozen (SIGSTOP, a long GC
pause) in between and never ran its renew loop. A leader that fails to renew
steps down at once.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Role(enum.Enum):
    FOLLOWER = "follower"
    LEADER = "leader"


@dataclass(frozen=True)
class Elected:
    epoch: int


@dataclass(frozen=True)
class SteppedDown:
    epoch: int
    reason: str


Change = Elected | SteppedDown


def holder_string(node_id: str, address: str) -> str:
    return f"{node_id}@{address}"


def parse_holder(holder: str) -> tuple[str, str]:
    """(node_id, address) from a holder string; ("", "") when empty or malformed."""
    node_id, sep, address = holder.rpartition("@")
    return (node_id, address) if sep else ("", "")


class LeaderState:
    """Where this replica stands in the election."""

    def __init__(self, ttl_s: float, margin_s: float) -> None:
        if margin_s >= ttl_s:
            raise ValueError("the safety margin must be shorter than the lease TTL")
        self.ttl_s = ttl_s
        self.margin_s = margin_s
        self.role = Role.FOLLOWER
        self.epoch = 0  # highest coordinator epoch seen (ours while leading)
        self.leader_id = ""
        self.leader_address = ""
        self.acting_until = 0.0

    def acting(self, now: float) -> bool:
        """Whether this replica may act as leader at monotonic time ``now``."""
        return self.role is Role.LEADER and now < self.acting_until

    def observed(self, holder: str, token: int) -> None:
        """What a poll of the lease showed (holder "" when free)."""
        self.leader_id, self.leader_address = parse_holder(holder)
        self.epoch = max(self.epoch, token)

    def acquired(self, token: int, holder: str, started_at: float) -> Change:
        self.role = Role.LEADER
        self.epoch = max(self.epoch, token)
        self.leader_id, self.leader_address = parse_holder(holder)
        self.acting_until = started_at + self.ttl_s - self.margin_s
        return Elected(token)

    def renewed(self, ok: bool, started_at: float, now: float) -> Change | None:
        """Outcome of a renew that started at ``started_at``; steps down on failure."""
        if self.role is not Role.LEADER:
            return None
        if ok and now < self.acting_until:
            self.acting_until = started_at + self.ttl_s - self.margin_s
            return None
        reason = "renew refused" if not ok else "renewed too late (lease may have lapsed)"
        return self.step_down(reason)

    def step_down(self, reason: str) -> SteppedDown | None:
        if self.role is not Role.LEADER:
            return None
        self.role = Role.FOLLOWER
        self.acting_until = 0.0
        self.leader_id = self.leader_address = ""
        return SteppedDown(self.epoch, reason)

    def saw_higher_epoch(self, epoch: int) -> Change | None:
        """Someone carries a higher coordinator epoch: a newer leader exists."""
        if epoch <= self.epoch:
            return None
        self.epoch = epoch
        return self.step_down(f"saw higher epoch {epoch}")
