"""Push admission: the consistency rules as a pure function.

Fed the job's counters and one push's key, returns a verdict; the servicer
executes it. No grpc, no torch: unit-tested with plain values.

Counters: ``version`` counts applied updates; ``clocks[slot]`` is the next step
each slot must push. A slot's pushes carry consecutive steps, so a step below
the slot's clock is a retry of an applied push (exactly once by sequence
number, the way TCP does it) and a step above it is a gap.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass


class Mode(enum.Enum):
    SYNC = "sync"
    ASYNC = "async"
    SSP = "ssp"


class Verdict(enum.Enum):
    ACCEPT = "accept"  # buffer (sync) or apply now (async, ssp)
    DUPLICATE = "duplicate"  # already applied with the same bytes: answer OK
    CONFLICT = "conflict"  # already applied with different bytes
    AHEAD = "ahead"  # a step the slot cannot have computed yet
    STALE_BASE = "stale_base"  # sync gradient computed from the wrong version
    WAIT = "wait"  # ssp: slot too far ahead, hold until the slowest catches up
    TOO_STALE = "too_stale"  # ssp with the refuse policy


@dataclass(frozen=True)
class Rules:
    mode: Mode
    num_slots: int
    staleness: int = 0
    refuse_when_stale: bool = False


def judge_push(
    rules: Rules,
    version: int,
    clocks: Sequence[int],
    step: int,
    slot: int,
    base_version: int,
    payload_crc: int,
    applied_crc: int | None,
) -> Verdict:
    """Decide what to do with a push of ``step`` from ``slot``.

    ``applied_crc`` is the CRC recorded when this (step, slot) was applied, or
    None if it was never applied or fell out of the dedupe window.
    """
    expected = version if rules.mode is Mode.SYNC else clocks[slot]
    if step < expected:
        if applied_crc is not None and applied_crc != payload_crc:
            return Verdict.CONFLICT
        return Verdict.DUPLICATE
    if step > expected:
        return Verdict.AHEAD
    if rules.mode is Mode.SYNC and base_version != version:
        return Verdict.STALE_BASE
    if rules.mode is Mode.SSP and step - min(clocks) > rules.staleness:
        return Verdict.TOO_STALE if rules.refuse_when_stale else Verdict.WAIT
    return Verdict.ACCEPT


def step_complete(rules: Rules, pending_slots: Sequence[int]) -> bool:
    """Sync: a step commits once every slot has pushed. Others commit each push."""
    if rules.mode is not Mode.SYNC:
        return True
    return len(set(pending_slots)) == rules.num_slots
