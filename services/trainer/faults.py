"""Test-only fault injection keyed by step, for chaos tests (never on by default).

Set ``--faults`` or ``STALWART_FAULTS`` to comma-separated ``name=value`` pairs:

- ``crash_at_step=N``: SIGKILL this process after pulling the weights for step N,
  before its gradient is pushed (the slot's step N is missing: the standby or
  the slot's next trainer must push it).
- ``crash_after_push=N``: SIGKILL right after step N's push was acknowledged
  (a successor's push of step N+1 must not repeat step N).
- ``hang_at_step=N``: stop making progress at step N while still heartbeating
  (a gray failure; the process stays alive until killed).
- ``delay_s=X``: sleep X seconds before every computed step (a slow node).

Only steps computed for a slot count; a standby never fires. Each fault fires
once; the log says so, so tests can check a fault actually fired.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

from stalwart import log

_KNOWN = {"crash_at_step", "crash_after_push", "hang_at_step", "delay_s"}


@dataclass(frozen=True)
class Faults:
    crash_at_step: int | None = None
    crash_after_push: int | None = None
    hang_at_step: int | None = None
    delay_s: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Faults:
        values: dict[str, float | int] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            name, sep, raw = part.partition("=")
            if not sep or name not in _KNOWN:
                raise ValueError(f"bad fault {part!r}; known: {sorted(_KNOWN)}")
            values[name] = float(raw) if name == "delay_s" else int(raw)
        return cls(**values)

    @property
    def active(self) -> bool:
        return self != Faults()

    def before_push(self, step: int) -> None:
        """Called with the gradient of ``step`` computed, before it is pushed."""
        if self.delay_s:
            time.sleep(self.delay_s)
        if step == self.crash_at_step:
            _die("crash_at_step", step)
        if step == self.hang_at_step:
            log.get_logger("stalwart.faults").warning(
                "fault fired", fault="hang_at_step", step=step
            )
            while True:  # until killed; the heartbeat task keeps running
                time.sleep(3600)

    def after_push(self, step: int) -> None:
        if step == self.crash_after_push:
            _die("crash_after_push", step)


def _die(fault: str, step: int) -> None:
    log.get_logger("stalwart.faults").warning("fault fired", fault=fault, step=step)
    # SIGKILL, not exit: no cleanup, no goodbye, exactly like kill -9 of a node
    os.kill(os.getpid(), signal.SIGKILL)
