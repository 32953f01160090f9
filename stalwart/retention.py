"""Checkpoint retention, garbage collection and tiering: decisions only.

Plain code fed what the store holds and returning what to do; the caller
(:mod:`stalwart.checkpoint`) does the deleting and copying. No torch, no grpc,
no I/O, so every rule is unit-tested with literals.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class CheckpointInfo:
    """What retention needs to know of one published checkpoint."""

    checkpoint_id: str
    step: int
    create_time_ns: int = 0

    @property
    def order_key(self) -> tuple[int, int, str]:
        # Step first: it is what "newest" means for training. Creation time
        # breaks ties between two checkpoints of one step (a re-save), the id
        # makes the order total so every caller agrees on it.
        return (self.step, self.create_time_ns, self.checkpoint_id)


def newest_first(checkpoints: Iterable[CheckpointInfo]) -> list[CheckpointInfo]:
    return sorted(checkpoints, key=lambda c: c.order_key, reverse=True)


@dataclass(frozen=True)
class RetentionDecision:
    keep: tuple[str, ...]
    delete: tuple[str, ...]


@dataclass(frozen=True)
class RetentionPolicy:
    """Keep the newest ``keep`` checkpoints of a job; the rest go.

    Checkpoints in ``pinned`` (e.g. the one a restore is reading, or the parent
    of a delta being written) are kept on top of the newest ``keep``.
    """

    keep: int

    def __post_init__(self) -> None:
        if self.keep < 1:
            raise ValueError(f"retention must keep at least 1 checkpoint, got {self.keep}")

    def decide(
        self, checkpoints: Iterable[CheckpointInfo], pinned: Collection[str] = ()
    ) -> RetentionDecision:
        ordered = newest_first(checkpoints)
        keep = [c.checkpoint_id for c in ordered[: self.keep]]
        keep += [c.checkpoint_id for c in ordered[self.keep :] if c.checkpoint_id in pinned]
        delete = [c.checkpoint_id for c in ordered if c.checkpoint_id not in keep]
        return RetentionDecision(tuple(keep), tuple(delete))


def unreferenced_chunks(
    stored: Iterable[str],
    references: Mapping[str, Collection[str]],
    protect: Collection[str] = (),
) -> list[str]:
    """Chunks no remaining manifest lists, sorted: what garbage collection deletes.

    ``references`` maps each remaining checkpoint to its chunk hashes; it must
    cover every manifest in the store that may share chunks (content
    addressing dedupes across checkpoints and jobs). ``protect`` holds chunks
    of uploads not yet published.
    """
    live: set[str] = set(protect)
    for hashes in references.values():
        live.update(hashes)
    return sorted(h for h in stored if h not in live)


@dataclass(frozen=True)
class TierPolicy:
    """Copy every ``every``-th checkpoint of a job to the durable tier (file://).

    ``sequence`` is the 1-based count of checkpoints a job has taken; with
    ``every=4`` the 4th, 8th, ... are copied. ``every=0`` turns tiering off.
    """

    every: int

    def __post_init__(self) -> None:
        if self.every < 0:
            raise ValueError(f"tier interval must be >= 0, got {self.every}")

    def due(self, sequence: int) -> bool:
        return self.every > 0 and sequence > 0 and sequence % self.every == 0
