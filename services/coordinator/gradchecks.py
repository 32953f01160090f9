"""Duplicate-compute decisions: which fingerprints agree, who is outvoted (pure).

A sampled slot batch (job, step, slot) is computed by the trainer holding the
slot and by one more trainer; equal CRC32Cs confirm it (gradients are bitwise
reproducible). When they differ a third trainer computes it and the majority
decides: a node whose fingerprint differs from a fingerprint two others agree
on is the suspect (quarantined by the caller); the slot holder, if outvoted,
drops its gradient, and whoever takes the slot next is held to the decided
fingerprint. With no majority possible (too few trainers), nothing is pushed
and the comparison starts over: a transient fault clears, a persistent one
stalls the step visibly instead of corrupting the model.

A verifier that does not answer in time is replaced by the next one; when every
candidate was too slow (a loaded machine), they are all asked again. Slowness
never turns a sampled batch into an unverified push: only a job with no other
trainer at all to compare with pushes unverified.

Clock passed in; no I/O. Used by services/coordinator/sdcguard.py.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field


class Verdict(enum.Enum):
    WAIT = "wait"
    PUSH = "push"
    DROP = "drop"


@dataclass
class Check:
    key: tuple[str, int, int]  # (job id, step, slot)
    created: float
    reports: dict[str, int] = field(default_factory=dict)  # node id -> CRC32C
    asked: dict[str, float] = field(default_factory=dict)  # verifier -> when asked
    skipped: set[str] = field(default_factory=set)  # asked, never answered in time
    decided: int | None = None  # the majority's CRC
    suspects: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Outcome:
    verdict: Verdict
    quarantine: tuple[str, ...] = ()  # newly outvoted nodes
    unverified: bool = False  # pushed without a comparison (no one else could compute)
    restarted: bool = False  # no majority possible: the comparison starts over


class GradientChecks:
    def __init__(self, verifier_timeout_s: float = 10.0, max_checks: int = 10_000):
        self.verifier_timeout_s = verifier_timeout_s
        self.max_checks = max_checks
        self.checks: dict[tuple[str, int, int], Check] = {}

    def holder_report(
        self, key: tuple[str, int, int], node: str, crc: int, candidates: Sequence[str], now: float
    ) -> Outcome:
        """The trainer holding the slot reports before pushing; ``candidates`` are
        other trainers able to compute the batch, best first."""
        check = self.checks.get(key)
        if check is None:
            check = self.checks[key] = Check(key, now)
            self._trim()
        if check.decided is not None:
            if crc == check.decided:
                return Outcome(Verdict.PUSH)
            return self._outvoted(check, node)
        check.reports[node] = crc
        self._expire_asks(check, now)
        outcome = self._decide(check, node)
        if outcome is not None:
            return outcome
        if not check.asked and not self._ask(check, candidates, now):
            if check.skipped and candidates:
                # every candidate was too slow: ask them again rather than push unchecked
                check.skipped.clear()
                if self._ask(check, candidates, now):
                    return Outcome(Verdict.WAIT)
            if len(check.reports) == 1 and not candidates:  # nobody else exists
                return Outcome(Verdict.PUSH, unverified=True)
            return self._restart(check)
        return Outcome(Verdict.WAIT)

    def duplicate_report(self, key: tuple[str, int, int], node: str, crc: int) -> tuple[str, ...]:
        """A verifier's recomputation; returns nodes newly outvoted by it."""
        check = self.checks.get(key)
        if check is None or node not in check.asked:
            return ()  # not asked (or a stale check): ignore
        check.asked.pop(node)
        check.reports[node] = crc
        before = set(check.suspects)
        self._settle(check)
        return tuple(sorted(check.suspects - before))

    def asked_of(self, node: str) -> list[tuple[str, int, int]]:
        """Batches this node is asked to recompute (sent with its heartbeat answers)."""
        return [c.key for c in self.checks.values() if node in c.asked]

    def forget_job(self, job_id: str) -> None:
        for key in [k for k in self.checks if k[0] == job_id]:
            del self.checks[key]

    # --- internals ----------------------------------------------------------------------

    def _decide(self, check: Check, holder: str) -> Outcome | None:
        self._settle(check)
        if check.decided is None:
            return None
        if check.reports[holder] == check.decided:
            return Outcome(Verdict.PUSH, tuple(sorted(check.suspects)))
        return Outcome(Verdict.DROP, tuple(sorted(check.suspects)))

    def _settle(self, check: Check) -> None:
        """Two equal fingerprints decide; every differing reporter is a suspect."""
        if check.decided is not None:
            check.suspects |= {n for n, c in check.reports.items() if c != check.decided}
            return
        votes = Counter(check.reports.values())
        crc, count = votes.most_common(1)[0] if votes else (None, 0)
        if count >= 2:
            check.decided = crc
            check.suspects |= {n for n, c in check.reports.items() if c != crc}

    def _outvoted(self, check: Check, node: str) -> Outcome:
        new = () if node in check.suspects else (node,)
        check.suspects.add(node)
        return Outcome(Verdict.DROP, new)

    def _ask(self, check: Check, candidates: Sequence[str], now: float) -> bool:
        for node in candidates:
            if node not in check.reports and node not in check.asked and node not in check.skipped:
                check.asked[node] = now
                return True
        return False

    def _expire_asks(self, check: Check, now: float) -> None:
        for node, when in list(check.asked.items()):
            if now - when > self.verifier_timeout_s:
                del check.asked[node]
                check.skipped.add(node)  # never answered: not asked again

    def _restart(self, check: Check) -> Outcome:
        del self.checks[check.key]
        return Outcome(Verdict.DROP, restarted=True)

    def _trim(self) -> None:
        while len(self.checks) > self.max_checks:
            del self.checks[next(iter(self.checks))]
