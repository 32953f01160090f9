"""Elastic slots: which trainer computes which slots when trainers and slots differ.

A slot is a data position, not a process: its gradient at step s is a function
of (weights at version s, seed, slot, s) alone, so any trainer may compute any
number of slots, one after another, and push each under its own (job, step,
slot) key. The paramserver still sums one gradient per slot in slot order, so
the result is bitwise the same however the slots are spread.

Two pure rules on one job's ``{slot: node id}`` (``""`` for a free slot):

* :func:`spill`: free slots that no idle trainer can take go to the trainers
  already holding slots of the job, the least loaded first, so a job never
  waits while one of its trainers is alive;
* :func:`extras`: the slots to hand to idle trainers when some trainer holds
  more than one, taken from the most loaded holder first and never its last
  slot, so slots spread out again as trainers join.

Ties are broken by the holders' rank (best first), then by node id, so the
same inputs always give the same answer. No I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def load(holders: Mapping[int, str]) -> dict[str, list[int]]:
    """node id -> the slots it holds, ascending."""
    out: dict[str, list[int]] = {}
    for slot in sorted(holders):
        node = holders[slot]
        if node:
            out.setdefault(node, []).append(slot)
    return out


def spill(holders: Mapping[int, str], rank: Sequence[str] = ()) -> list[tuple[int, str]]:
    """(slot, node) for every free slot, each given to the holder with the fewest slots.

    ``rank`` lists node ids best first (placement's order); a holder missing from
    it ranks after those in it. Nothing to give (no free slot, or no holder): [].
    """
    counts = {node: len(slots) for node, slots in load(holders).items()}
    if not counts:
        return []
    order = {node: i for i, node in enumerate(rank)}
    out: list[tuple[int, str]] = []
    for slot in sorted(s for s, node in holders.items() if not node):
        node = min(counts, key=lambda n: (counts[n], order.get(n, len(order)), n))
        out.append((slot, node))
        counts[node] += 1
    return out


def extras(holders: Mapping[int, str], rank: Sequence[str] = ()) -> list[int]:
    """Slots that idle trainers should take, in the order they should take them.

    Each comes from the holder with the most slots at that point (ties: the
    worse-ranked holder gives first, keeping the best one's work where it is),
    and is that holder's highest slot; every holder keeps at least one.
    """
    slots_of = load(holders)
    order = {node: i for i, node in enumerate(rank)}
    out: list[int] = []
    while True:
        giving = [n for n, s in slots_of.items() if len(s) > 1]
        if not giving:
            return out
        node = max(giving, key=lambda n: (len(slots_of[n]), order.get(n, len(order)), n))
        out.append(slots_of[node].pop())
