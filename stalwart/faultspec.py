"""The ``--faults`` text of test-only fault injection: ``name=value`` pairs, comma-separated.

Trainers (services/trainer/faults.py) and paramservers
(services/paramserver/faults.py) each name the faults they know; this parses
and checks the text for both, so a typo fails at start-up instead of silently
injecting nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar


def parse(text: str, known: Mapping[str, type]) -> dict[str, int | float]:
    """``{"name": value}`` converted by ``known[name]``; ValueError naming the bad part."""
    values: dict[str, int | float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, raw = part.partition("=")
        if not sep or name not in known:
            raise ValueError(f"bad fault {part!r}; known: {sorted(known)}")
        try:
            values[name] = known[name](raw)
        except ValueError:
            raise ValueError(
                f"bad fault {part!r}: {raw!r} is not a {known[name].__name__}"
            ) from None
    return values


class FaultSet:
    """Base of a frozen dataclass of faults whose class attribute ``KNOWN`` names them."""

    KNOWN: ClassVar[Mapping[str, type]] = {}

    @classmethod
    def parse(cls, text: str):
        return cls(**parse(text, cls.KNOWN))

    @property
    def active(self) -> bool:
        return self != type(self)()
