"""Local service processes for tests, benchmarks and ``stalwart up``.

A service is started as ``python -m <module> --port 0 --ready-file <file> ...``;
the bootstrap writes the ready file (atomically) once the server is bound and
serving, so reading it tells us the real port without racing on "port free?".
Each process gets its own session (process group), so :meth:`ServiceProcess.kill`
takes its children (data loader workers...) down with it, as a node crash would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

LOG_TAIL_LINES = 40


class ServiceStartError(RuntimeError):
    """The process exited or did not get ready in time; the message holds its log tail."""


@dataclass
class ServiceProcess:
    """A running service started by :func:`start_service`."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    ready_file: Path
    ready: dict[str, Any] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def address(self) -> str:
        """``host:port`` to dial, from the ready file."""
        return self.ready["address"]

    @property
    def metrics_port(self) -> int | None:
        return self.ready.get("metrics_port")

    @property
    def node_id(self) -> str:
        return self.ready["node_id"]

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> int:
        """SIGKILL the whole process group (a crash, no goodbye) and reap it."""
        self._signal_group(signal.SIGKILL)
        return self.popen.wait()

    def terminate(self, timeout: float = 15.0) -> int:
        """SIGTERM (graceful shutdown); SIGKILL if it is still there after ``timeout``."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return self.kill()

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _signal_group(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            pass  # already gone

    def __enter__(self) -> ServiceProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.terminate()


def start_service(
    module: str,
    args: Sequence[str],
    run_dir: Path,
    name: str,
    env: Mapping[str, str] | None = None,
    timeout: float = 90.0,  # generous: a loaded 2-core machine imports torch slowly
    cwd: Path | None = None,
) -> ServiceProcess:
    """Start ``python -m module --port 0 --ready-file ... *args`` and wait until it serves.

    Output goes to ``<run_dir>/<name>.log``. ``env`` adds to (and overrides) this
    process's environment. Flags in ``args`` come last, so they override the
    defaults (``--port 7000`` wins over ``--port 0``).
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    ready_file = run_dir / f"{name}.ready.json"
    ready_file.unlink(missing_ok=True)  # a stale one would look ready at once
    log_path = run_dir / f"{name}.log"
    command = [
        sys.executable, "-m", module, "--port", "0", "--ready-file", str(ready_file), *args,
    ]  # fmt: skip
    with open(log_path, "ab") as log_file:
        popen = _spawn(command, log_file, env, cwd)
    proc = ServiceProcess(name, popen, log_path, ready_file)
    proc.ready = _wait_ready(proc, timeout)
    return proc


def _spawn(
    command: list[str], log_file: IO[bytes], env: Mapping[str, str] | None, cwd: Path | None
) -> subprocess.Popen[bytes]:
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        env=full_env,
        cwd=cwd,
        start_new_session=True,
    )


def _wait_ready(proc: ServiceProcess, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready = _read_ready(proc.ready_file)
        if ready is not None:
            return ready
        if not proc.alive():
            raise ServiceStartError(
                f"{proc.name} exited with status {proc.returncode} before it was ready; "
                f"log {proc.log_path}:\n{proc.log_tail()}"
            )
        time.sleep(0.05)  # a file poll; the child writes it once, atomically
    proc.kill()
    raise ServiceStartError(
        f"{proc.name} not ready after {timeout:.0f}s; log {proc.log_path}:\n{proc.log_tail()}"
    )


def _read_ready(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
