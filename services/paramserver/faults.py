"""Test-only fault injection for paramserver replicas, keyed by version (never on by default).

Set ``--faults`` or ``STALWART_FAULTS`` (same syntax as the trainer's):

- ``flip_state_at_version=N``: right after this replica applies the commit that
  reaches version N, flip one bit (a float32's top mantissa bit: finite, off by
  up to half) of its first parameter, as a memory fault would. Nothing on the
  wire changes: only comparing replica fingerprints can tell.
- ``hang_commit_at_version=N``: a primary about to commit the step that would
  reach version N + 1 (every slot of step N pushed) stops there for good, the
  job's lock held, while its server goes on answering heartbeats and polls: a
  wedged commit path.
- ``crash_at_version=N``: SIGKILL this process right after it applies the commit
  that reaches version N (before the step is acknowledged), as kill -9 would.
- ``crash_before_commit_at_version=N``: a primary about to commit the step that
  would reach version N + 1 (every slot of step N pushed, none of it forwarded to a
  backup yet) is SIGKILLed there: the step is lost with it, while the job's other
  shard groups commit it.
- ``slow_commit_at_version=N``: a primary about to commit the step that would reach
  version N + 1 waits ``SLOW_COMMIT_S`` first, the job's lock held, as a busy
  machine would: long enough for the client of the push that started the commit to
  give up on it.
- ``commit_across_promotion_at_version=N``: a primary about to send its backups the
  commit that would reach version N + 1, the request already made under its epoch,
  holds it (the job's lock held) until it is promoted to another epoch, up to
  ``PROMOTION_WAIT_S``: a commit begun under the old epoch meets backups a
  re-promotion already configured at the new one.
- ``slow_install_seconds=S``: a backup that receives a job's state from its primary
  (InstallState) holds it S seconds before taking it, as a slow disk or a busy
  machine would: the primary meanwhile has no backup in sync.

Each fault fires once and logs that it did, so tests can check it really fired.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from stalwart import faultspec, log

_KNOWN = {"flip_state_at_version": int, "hang_commit_at_version": int, "crash_at_version": int,
          "crash_before_commit_at_version": int, "slow_commit_at_version": int,
          "commit_across_promotion_at_version": int, "slow_install_seconds": float}  # fmt: skip
SLOW_COMMIT_S = 1.0
PROMOTION_WAIT_S = 60.0


@dataclass(frozen=True)
class Faults(faultspec.FaultSet):
    KNOWN = _KNOWN

    flip_state_at_version: int | None = None
    hang_commit_at_version: int | None = None
    crash_at_version: int | None = None
    crash_before_commit_at_version: int | None = None
    slow_commit_at_version: int | None = None
    commit_across_promotion_at_version: int | None = None
    slow_install_seconds: float | None = None
    fired: set = field(default_factory=set, compare=False, repr=False)

    def after_apply(self, model) -> None:
        """Called with the job's lock held, right after ``model`` reached a new version."""
        if model.version == self.crash_at_version:
            log.get_logger("stalwart.faults").warning(
                "fault fired", fault="crash_at_version", version=model.version
            )
            # SIGKILL, not exit: no cleanup and no goodbye, exactly like kill -9
            os.kill(os.getpid(), signal.SIGKILL)
        if model.version == self.flip_state_at_version and "flip_state" not in self.fired:
            self.fired.add("flip_state")
            from stalwart import sdc  # torch-side helper, only when the fault is on

            name = sdc.flip_bit(model.params)
            log.get_logger("stalwart.faults").warning(
                "fault fired", fault="flip_state_at_version", version=model.version, tensor=name
            )

    async def before_install(self, job_id: str) -> None:
        """Called on a backup with a job's state read, before it takes it."""
        if self.slow_install_seconds is not None and "slow_install" not in self.fired:
            self.fired.add("slow_install")
            log.get_logger("stalwart.faults").warning(
                "fault fired", fault="slow_install_seconds", job=job_id,
                seconds=self.slow_install_seconds,
            )  # fmt: skip
            await asyncio.sleep(self.slow_install_seconds)

    @property
    def at_commit(self) -> bool:
        """Whether :meth:`before_commit` has anything to do."""
        return (
            self.hang_commit_at_version is not None
            or self.crash_before_commit_at_version is not None
            or self.slow_commit_at_version is not None
        )

    async def before_commit(self, model) -> None:
        """Called with the job's lock held, before a primary commits from ``model``'s version."""
        if model.version == self.crash_before_commit_at_version:
            log.get_logger("stalwart.faults").warning(
                "fault fired", fault="crash_before_commit_at_version", version=model.version
            )
            os.kill(os.getpid(), signal.SIGKILL)
        if model.version == self.hang_commit_at_version and "hang_commit" not in self.fired:
            self.fired.add("hang_commit")
            log.get_logger("stalwart.faults").warning(
                "fault fired", fault="hang_commit_at_version", version=model.version
            )
            await asyncio.Event().wait()  # never set: the commit never happens
        if model.version == self.slow_commit_at_version and "slow_commit" not in self.fired:
            self.fired.add("slow_commit")
            log.get_logger("stalwart.faults").warning(
                "fault fired", fault="slow_commit_at_version", version=model.version
            )
            await asyncio.sleep(SLOW_COMMIT_S)  # the fault is the wait itself

    async def before_sending_commit(self, model, epoch_now: Callable[[], int]) -> None:
        """Called with the job's lock held, a commit's request made under ``epoch_now()``."""
        if model.version != self.commit_across_promotion_at_version:
            return
        if "commit_across_promotion" in self.fired:
            return
        self.fired.add("commit_across_promotion")
        made_under = epoch_now()
        log.get_logger("stalwart.faults").warning(
            "fault fired", fault="commit_across_promotion_at_version", version=model.version,
            epoch=made_under,
        )  # fmt: skip
        deadline = time.monotonic() + PROMOTION_WAIT_S
        while epoch_now() == made_under and time.monotonic() < deadline:
            await asyncio.sleep(0.05)  # the fault is the wait for the promotion
