"""Local service processes for tests, benchmarks and ``stalwart up``.

A service is started as ``python -m <module> --port 0 --ready-file <file> ...``;
the bootstrap writes the ready file (atomically) once the server is bound and
serving, so reading it tells us the real port without racing on "port free?".
Each process gets its own session (process group), so :meth:`ServiceProcess.kill`
takes its children (data loader workers...) down with it, as a node crash would.

``preload=True`` forks the service from a server process that has already
imported torch, grpc and numpy (:mod:`multiprocessing`'s forkserver) instead of
starting a fresh interpreter: the same module runs with the same arguments,
output and session, but without paying ~3 s of imports each time. Test suites
that start hundreds of services use it; ``stalwart up`` does not, because its
services must outlive the command that started them. As with any multiprocessing
start method but fork, a script that uses it needs the ``if __name__ == "__main__":``
guard (the fork server imports the caller's main module).
"""

from __future__ import annotations

import ctypes
import json
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

LOG_TAIL_LINES = 40
_CLONE_NEWNET = 0x40000000  # <sched.h>

# Imported once by the fork server; what services import beyond these is cheap.
# torch._dynamo (1.5 s) is what torch.optim pulls in at a service's first optimizer step.
PRELOADED_MODULES = [
    "torch", "torch._dynamo", "grpc", "numpy", "google.protobuf", "pydantic_settings",
]  # fmt: skip


class ServiceStartError(RuntimeError):
    """The process exited or did not get ready in time; the message holds its log tail."""


class ProcessHandle(Protocol):
    """What ServiceProcess needs of a child: the subset of subprocess.Popen it uses."""

    pid: int

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def send_signal(self, sig: int) -> None: ...


@dataclass
class ServiceProcess:
    """A running service started by :func:`start_service`."""

    name: str
    popen: ProcessHandle
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
    preload: bool = False,
    netns: str | None = None,
) -> ServiceProcess:
    """Start ``python -m module --port 0 --ready-file ... *args`` and wait until it serves.

    Output goes to ``<run_dir>/<name>.log``. ``env`` adds to (and overrides) this
    process's environment. Flags in ``args`` come last, so they override the
    defaults (``--port 7000`` wins over ``--port 0``). ``preload``: fork it from the
    preloaded server (see the module docstring) instead of starting a new interpreter.
    ``netns``: run it in that network namespace (``ip netns``; tests of network faults
    give each service a host of its own).
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    ready_file = run_dir / f"{name}.ready.json"
    ready_file.unlink(missing_ok=True)  # a stale one would look ready at once
    log_path = run_dir / f"{name}.log"
    argv = ["--port", "0", "--ready-file", str(ready_file), *args]
    if preload:
        popen: ProcessHandle = _fork_preloaded(module, argv, log_path, env, cwd, netns)
    else:
        command = [sys.executable, "-m", module, *argv]
        if netns:
            command = ["ip", "netns", "exec", netns, *command]  # execs: the pid stays
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


class _ForkedProcess:
    """A multiprocessing child seen through the Popen calls ServiceProcess makes."""

    def __init__(self, process: multiprocessing.process.BaseProcess) -> None:
        self._process = process
        self.pid: int = process.pid  # type: ignore[assignment]

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
        return self._process.exitcode

    def send_signal(self, sig: int) -> None:
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass  # already gone


def _fork_preloaded(
    module: str,
    argv: list[str],
    log_path: Path,
    env: Mapping[str, str] | None,
    cwd: Path | None,
    netns: str | None = None,
) -> _ForkedProcess:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOADED_MODULES)
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    where = str(cwd or os.getcwd())
    # daemon: if the caller exits without stopping it, multiprocessing terminates
    # it instead of waiting for it forever
    process = context.Process(
        target=_run_module,
        args=(module, argv, str(log_path), full_env, where, netns),
        daemon=True,
    )
    process.start()
    return _ForkedProcess(process)


def _run_module(
    module: str, argv: list[str], log_path: str, env: dict[str, str], cwd: str,
    netns: str | None = None,
) -> None:  # fmt: skip
    """In the forked child: become what ``python -m module *argv`` would have been."""
    if netns:
        _enter_netns(netns)
    os.setsid()
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null_fd = os.open(os.devnull, os.O_RDONLY)
    for source, target in ((null_fd, 0), (log_fd, 1), (log_fd, 2)):
        os.dup2(source, target)
    os.close(log_fd)
    os.close(null_fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - lives as long as the process
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.path.insert(0, cwd)  # as ``python -m`` puts the working directory first
    # A daemonic multiprocessing child may not start children of its own; the
    # service may (data loader workers), and is stopped by its caller anyway.
    multiprocessing.current_process()._config["daemon"] = False  # type: ignore[attr-defined]
    sys.argv = [module, *argv]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def _enter_netns(name: str) -> None:
    """Move this process into the network namespace ``ip netns add name`` made, as
    ``ip netns exec`` would (Python 3.11 has no ``os.setns``; libc has)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns into network namespace {name}: {os.strerror(errno)}")
    finally:
        os.close(fd)


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
