"""Test-only fault injection for paramserver replicas, keyed by version (never on by default).

Set ``--faults`` or ``STALWART_FAULTS`` (same syntax as the trainer's):

- ``flip_state_at_version=N``: right after this replica applies the commit that
  reaches version N, flip one bit (a float32's top mantissa bit: finite, off by
  up to half) of its first parameter, as a memory fault would. Nothing on the
  wire changes: only comparing replica fingerprints can tell.

Each fault fires once and logs that it did, so tests can check it really fired.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stalwart import faultspec, log

_KNOWN = {"flip_state_at_version": int}


@dataclass(frozen=True)
class Faults(faultspec.FaultSet):
    KNOWN = _KNOWN

    flip_state_at_version: int | None = None
    fired: set = field(default_factory=set, compare=False, repr=False)

    def after_apply(self, model) -> None:
        """Called with the job's lock held, right after ``model`` reached a new version."""
        if model.version == self.flip_state_at_version and "flip_state" not in self.fired:
            self.fired.add("flip_state")
            from stalwart import sdc  # torch-side helper, only when the fault is on

            name = sdc.flip_bit(model.params)
            log.get_logger("stalwart.faults").warning(
                "fault fired", fault="flip_state_at_version", version=model.version, tensor=name
            )
