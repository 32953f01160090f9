"""Drain decisions: when a node starts draining, when it is drained, when health asks for
it, and when it returns to service.

Draining moves a node's work to others (placement does the moving: a DRAINING
node is not eligible for work) and then gives it no more. Plain functions.
"""

from __future__ import annotations

import enum

from services.coordinator.membership import NodeState


class DrainDecision(enum.Enum):
    START = "start"  # ALIVE -> DRAINING
    ALREADY = "already"  # draining or drained: a retried request changes nothing
    REFUSE = "refuse"  # dead or quarantined: nothing left to drain


def decide_drain(state: NodeState) -> DrainDecision:
    """What a DrainNode request does to a node in ``state``."""
    if state is NodeState.ALIVE:
        return DrainDecision.START
    if state in (NodeState.DRAINING, NodeState.DRAINED):
        return DrainDecision.ALREADY
    return DrainDecision.REFUSE


class UndrainDecision(enum.Enum):
    RESUME = "resume"  # DRAINING or DRAINED -> ALIVE: it is given work again
    ALREADY = "already"  # in service: a retried request changes nothing
    REFUSE = "refuse"  # dead or quarantined: undraining would not bring it back


def decide_undrain(state: NodeState, release_quarantine: bool = False) -> UndrainDecision:
    """What an UndrainNode request does to a node in ``state`` (kubectl's uncordon). A
    quarantined node (corrupt numbers came from it) comes back only when the request
    says so explicitly: an operator who checked or replaced its hardware."""
    if state in (NodeState.DRAINING, NodeState.DRAINED):
        return UndrainDecision.RESUME
    if state is NodeState.QUARANTINED and release_quarantine:
        return UndrainDecision.RESUME
    if state is NodeState.ALIVE:
        return UndrainDecision.ALREADY
    return UndrainDecision.REFUSE


def is_drained(state: NodeState, holds_work: bool) -> bool:
    """A draining node becomes DRAINED once it holds neither a slot nor a standby place."""
    return state is NodeState.DRAINING and not holds_work


def should_drain_for_health(state: NodeState, health_score: float, threshold: float) -> bool:
    """Drain a live node whose health score (1 healthy, 0 about to fail) fell below threshold."""
    return state is NodeState.ALIVE and health_score < threshold
