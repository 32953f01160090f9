"""The one launcher of the service processes a test starts.

Every test folder that starts services goes through :class:`Launcher`: each process
is started by :func:`stalwart.procs.start_service` (forked preloaded unless
``STALWART_TEST_PRELOAD=0``), its name carries the test's prefix so that the logs of
two tests never mix in one run folder, and :meth:`Launcher.stop_all` ends every
process it started, whatever the test did to it (SIGKILL, SIGSTOP, restarts).
Folders add only their own vocabulary on top (a coordinator with its store flags, a
paramserver pair, ...).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from stalwart.procs import ServiceProcess, start_service
from tests.helpers import PRELOAD

ROOT = Path(__file__).resolve().parents[1]


class Launcher:
    """Starts services under ``run_dir`` with ``flags`` first; :meth:`stop_all` ends them."""

    def __init__(
        self,
        run_dir: Path,
        prefix: str = "",
        flags: Sequence[str] = (),
        timeout: float = 60.0,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.prefix = prefix or "t" + uuid.uuid4().hex[:8]  # this test's keys and logs
        self.flags = tuple(flags)
        self.timeout = timeout
        self.procs: list[ServiceProcess] = []

    def launch(
        self, module: str, name: str, *args: str, env: Mapping[str, str] | None = None
    ) -> ServiceProcess:
        """``python -m module`` with this launcher's flags, then ``args`` (which win)."""
        proc = start_service(module, [*self.flags, *args], self.run_dir,
                             f"{self.prefix}-{name}", env=env, cwd=ROOT,
                             timeout=self.timeout, preload=PRELOAD)  # fmt: skip
        self.procs.append(proc)
        return proc

    def stop_all(self, timeout_s: float = 10.0) -> None:
        """SIGCONT (a stopped process cannot handle SIGTERM) and SIGTERM to every live
        process at once, then reap each, or SIGKILL it after ``timeout_s``."""
        alive = [p for p in self.procs if p.alive()]
        for proc in alive:
            for sig in (signal.SIGCONT, signal.SIGTERM):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)
        for proc in alive:
            try:
                proc.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.procs.clear()
