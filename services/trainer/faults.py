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
- ``flip_bit_at_step=N``: flip one bit (a float32's top mantissa bit: finite, off by
  up to half) in the gradient of step N after computing it, as silent data
  corruption would; only duplicate computation can tell.
- ``device_full_from_step=N``: computing step N, and every step after it, raises
  what torch raises for a GPU out of memory (``torch.cuda.OutOfMemoryError``), as a
  device another process filled would: this machine's fault, not the job's.
- ``heat_from_step=N``: from step N on, the reported ``gpu_temperature_celsius``
  climbs 5 C per step from 70 C (65 C before N), and each step computed takes
  ``HEAT_THROTTLE_S`` longer, as a hot GPU slows its clocks: a node the health
  service should see failing and the coordinator drain before a scripted crash.
  The health service samples by time and the crash is keyed by step, so the
  throttling is what leaves it time on a machine fast enough to run tens of
  steps a second.

Only steps computed for a slot count; a standby never fires. Each fault fires
once; the log says so, so tests can check a fault actually fired.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field

from stalwart import faultspec, log

# seconds a heated node's step takes longer (heat_from_step)
HEAT_THROTTLE_S = 0.1

_KNOWN = {
    "crash_at_step": int,
    "crash_after_push": int,
    "hang_at_step": int,
    "delay_s": float,
    "flip_bit_at_step": int,
    "heat_from_step": int,
    "device_full_from_step": int,
}


@dataclass(frozen=True)
class Faults(faultspec.FaultSet):
    KNOWN = _KNOWN

    crash_at_step: int | None = None
    crash_after_push: int | None = None
    hang_at_step: int | None = None
    delay_s: float = 0.0
    flip_bit_at_step: int | None = None
    heat_from_step: int | None = None
    device_full_from_step: int | None = None
    # faults that do not end the process remember firing, so a recomputed step is clean
    fired: set = field(default_factory=set, compare=False, repr=False)

    @property
    def sleeps(self) -> bool:
        """A fault that sleeps or hangs inside a step's compute is configured."""
        return (
            bool(self.delay_s) or self.heat_from_step is not None or self.hang_at_step is not None
        )

    def before_push(self, step: int) -> None:
        """Called with the gradient of ``step`` computed, before it is pushed."""
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.heat_from_step is not None and step >= self.heat_from_step:
            time.sleep(HEAT_THROTTLE_S)
        if step == self.crash_at_step:
            _die("crash_at_step", step)
        if step == self.hang_at_step:
            log.get_logger("stalwart.faults").warning(
                "fault fired", fault="hang_at_step", step=step
            )
            while True:  # until killed; the heartbeat thread keeps running
                time.sleep(3600)

    def in_compute(self, step: int) -> None:
        """Called inside the step's compute, where the model's own errors are caught."""
        if self.device_full_from_step is not None and step >= self.device_full_from_step:
            import torch  # only when the fault is on

            log.get_logger("stalwart.faults").warning(
                "fault fired", fault="device_full_from_step", step=step
            )
            raise torch.cuda.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB (device_full_from_step)"
            )

    def corrupt(self, step: int, grads) -> None:
        """Called with the gradient of ``step`` computed (before any check of it)."""
        if step == self.flip_bit_at_step and "flip_bit_at_step" not in self.fired:
            self.fired.add("flip_bit_at_step")
            from stalwart import sdc  # torch-side helper, only when the fault is on

            name = sdc.flip_bit(grads)
            log.get_logger("stalwart.faults").warning(
                "fault fired", fault="flip_bit_at_step", step=step, tensor=name
            )

    def telemetry(self, last_step: int) -> dict[str, float]:
        """Readings that replace the real ones (empty when no telemetry fault is on)."""
        if self.heat_from_step is None:
            return {}
        if last_step < self.heat_from_step:
            return {"gpu_temperature_celsius": 65.0}
        return {"gpu_temperature_celsius": 70.0 + 5.0 * (last_step - self.heat_from_step)}

    def after_push(self, step: int) -> None:
        if step == self.crash_after_push:
            _die("crash_after_push", step)


def _die(fault: str, step: int) -> None:
    log.get_logger("stalwart.faults").warning("fault fired", fault=fault, step=step)
    # SIGKILL, not exit: no cleanup, no goodbye, exactly like kill -9 of a node
    os.kill(os.getpid(), signal.SIGKILL)
