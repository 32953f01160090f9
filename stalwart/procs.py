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
that start hundreds of services use it. As with any multiprocessing start method
but fork, a script that uses it needs the ``if __name__ == "__main__":`` guard
(the fork server imports the caller's main module). That server dies with the
process that started it, and so would the services' daemon flag.

``launcher=`` (a :class:`Launcher`) forks the service from a detached process that
has imported the same modules, ``python -m stalwart.procs``: it runs in a session
of its own, outlives the command that started it and serves fork requests on an
abstract unix socket (same user only) until it is stopped. ``stalwart up`` uses one
per cluster, so its services outlive the command and a later command (a stand-in
for a dead trainer) forks from the same launcher. A launcher started with an
``owner`` (benchmarks, the demo) instead stops every service it forked once that
process has exited, however it ended (SIGTERM, kill -9, out of memory): its
``finally`` that stops the cluster may never have run. The child is set up by the same
code as the fork server's (:func:`_run_module`), so either way a service runs as
``python -m`` would have run it: own session, log, environment, working directory.
The launcher never initialises CUDA (it refuses to fork if torch has), so a trainer
forked from it starts CUDA as a fresh interpreter would.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib
import json
import multiprocessing
import os
import runpy
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

LOG_TAIL_LINES = 40
_CLONE_NEWNET = 0x40000000  # <sched.h>
_PR_SET_NAME = 15  # <linux/prctl.h>

# Imported once by the fork server; what services import beyond these is cheap.
# torch._dynamo is what torch.optim pulls in at a service's first optimizer step.
# structlog, rich, prometheus_client and stalwart's own shared modules: ~1 s more per
# service, none of them reads the environment when imported. scikit-learn is left out
# (3.5 s of the launcher's import, on `stalwart up`'s critical path): the digits task
# reads its CSV without it, and the health service imports it at its first fit.
PRELOADED_MODULES = [
    "torch", "torch._dynamo", "grpc", "numpy", "google.protobuf", "pydantic_settings",
    "structlog", "rich.console", "prometheus_client", "stalwart.api", "stalwart.server",
    "stalwart.training",
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
    launcher: Launcher | None = None,
) -> ServiceProcess:
    """Start ``python -m module --port 0 --ready-file ... *args`` and wait until it serves.

    Output goes to ``<run_dir>/<name>.log``. ``env`` adds to (and overrides) this
    process's environment. Flags in ``args`` come last, so they override the
    defaults (``--port 7000`` wins over ``--port 0``). ``preload``: fork it from the
    preloaded server (see the module docstring) instead of starting a new interpreter.
    ``netns``: run it in that network namespace (``ip netns``; tests of network faults
    give each service a host of its own). ``launcher``: fork it from that detached
    launcher (it wins over ``preload``).
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    ready_file = run_dir / f"{name}.ready.json"
    ready_file.unlink(missing_ok=True)  # a stale one would look ready at once
    log_path = run_dir / f"{name}.log"
    argv = ["--port", "0", "--ready-file", str(ready_file), *args]
    if launcher is not None:
        full_env = _service_env(env)
        popen: ProcessHandle = launcher.fork(
            module, argv, log_path, full_env, str(cwd or os.getcwd()), netns
        )
    elif preload:
        popen = _fork_preloaded(module, argv, log_path, env, cwd, netns)
    else:
        command = [sys.executable, "-m", module, *argv]
        if netns:
            command = ["ip", "netns", "exec", netns, *command]  # execs: the pid stays
        with open(log_path, "ab") as log_file:
            popen = _spawn(command, log_file, env, cwd)
    proc = ServiceProcess(name, popen, log_path, ready_file)
    try:
        proc.ready = _wait_ready(proc, timeout)
    except BaseException:  # the caller never gets it to stop (SIGTERM's unwind, Ctrl-C)
        proc.kill()
        raise
    return proc


def _service_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """A service's whole environment: this process's, unbuffered output, then ``env``."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}


def _spawn(
    command: list[str], log_file: IO[bytes], env: Mapping[str, str] | None, cwd: Path | None
) -> subprocess.Popen[bytes]:
    full_env = _service_env(env)
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
    full_env = _service_env(env)
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


# --- the detached launcher ---------------------------------------------------------------

_LAUNCHER_MODULE = "stalwart.procs"
# a fork of a process holding torch takes milliseconds; a loaded machine more
_CALL_TIMEOUT_S = 30.0
OWNER_CHECK_S = 0.5  # how often a launcher with an owner looks whether it still runs
OWNER_STOP_S = 10.0  # how long its services get to stop after SIGTERM, then SIGKILL


class LauncherError(ServiceStartError):
    """The launcher could not be reached or refused a request; the message says why."""


@dataclass(frozen=True)
class Launcher:
    """Handle of a detached preloaded launcher (``python -m stalwart.procs``), by its
    socket and process; what a state file records of it (:meth:`start`, :meth:`stop`)."""

    address: str
    """Name of its abstract unix socket (without the leading NUL)."""
    pid: int
    start_ticks: int = 0
    """Its start time (/proc stat), to know it after a pid reuse."""
    log: str = ""

    @classmethod
    def start(cls, run_dir: Path, name: str = "launcher", timeout: float = 90.0,
              cwd: Path | None = None, owner: int | None = None,
              owner_scratch: Path | None = None) -> Launcher:  # fmt: skip
        """Start one in its own session (log ``<run_dir>/<name>.log``) and return once it
        has imported :data:`PRELOADED_MODULES` and listens.

        ``owner``: a pid; once that process has exited, the launcher stops every
        service it forked (SIGTERM to each one's group, SIGKILL after
        OWNER_STOP_S), removes ``owner_scratch`` (the run's own store) and exits."""
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        ready_file = run_dir / f"{name}.ready.json"
        ready_file.unlink(missing_ok=True)
        log_path = run_dir / f"{name}.log"
        address = f"stalwart-launcher-{os.getpid()}-{secrets.token_hex(8)}"
        command = [sys.executable, "-m", _LAUNCHER_MODULE, "--address", address,
                   "--ready-file", str(ready_file)]  # fmt: skip
        if owner is not None:
            command += ["--owner", f"{owner}:{process_start_ticks(owner) or 0}"]
            if owner_scratch is not None:
                command += ["--owner-scratch", str(owner_scratch)]
        with open(log_path, "ab") as log_file:
            popen = _spawn(command, log_file, None, cwd)
        proc = ServiceProcess(name, popen, log_path, ready_file)
        try:
            proc.ready = _wait_ready(proc, timeout)
        except BaseException:  # nobody would know to stop it
            proc.kill()
            raise
        return cls(address, popen.pid, process_start_ticks(popen.pid) or 0, str(log_path))

    def alive(self) -> bool:
        """Running, and the process this handle was made for (not a reused pid)."""
        return _running(self.pid, self.start_ticks)

    def fork(self, module: str, argv: list[str], log_path: Path, env: Mapping[str, str],
             cwd: str, netns: str | None = None) -> _LaunchedProcess:  # fmt: skip
        """Fork ``python -m module *argv`` (the environment is ``env``, not this process's)."""
        answer = self._call({"op": "fork", "module": module, "argv": list(argv),
                             "log_path": str(log_path), "env": dict(env), "cwd": cwd,
                             "netns": netns})  # fmt: skip
        return _LaunchedProcess(int(answer["pid"]), self)

    def exit_status(self, pid: int) -> int | None:
        """The exit status of a child it forked; None while it runs."""
        return self._call({"op": "status", "pid": pid})["exitcode"]

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM it (the services it forked live on: they have sessions of their own),
        SIGKILL after ``timeout_s``; a launcher already gone is fine."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not self.alive():
                return
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and self.alive():
                time.sleep(0.02)

    def _call(self, request: dict[str, Any]) -> dict[str, Any]:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(_CALL_TIMEOUT_S)
                sock.connect("\0" + self.address)
                sock.sendall(json.dumps(request).encode() + b"\n")
                answer = json.loads(_read_line(sock))
        except (OSError, ValueError) as exc:
            raise LauncherError(f"launcher pid {self.pid} ({self.log}): {exc}") from exc
        if "error" in answer:
            raise LauncherError(f"launcher pid {self.pid}: {answer['error']}")
        return answer


ServiceStarter = Callable[[str, Sequence[str], str], ServiceProcess]
"""``start(module, args, name)``: :func:`start_service` into a fixed run folder."""


@contextlib.contextmanager
def owned_services(run_dir: Path, timeout: float = 90.0) -> Iterator[ServiceStarter]:
    """For a command that starts services of its own rather than a cluster (``bench
    ps``, ``bench exchange``, ``bench ckpt``): yields ``start(module, args, name)``,
    which forks each from a launcher this process owns, so they stop once it has
    exited, even by kill -9, where the command's ``finally`` never runs. On leaving,
    every service started is stopped (SIGTERM), then the launcher."""
    launcher = Launcher.start(run_dir, timeout=timeout, owner=os.getpid())
    started: list[ServiceProcess] = []

    def start(module: str, args: Sequence[str], name: str) -> ServiceProcess:
        proc = start_service(module, args, run_dir, name, timeout=timeout, launcher=launcher)
        started.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in started:
            proc.terminate()
        launcher.stop()


class _LaunchedProcess:
    """A service the launcher forked, seen through the Popen calls ServiceProcess makes.
    The launcher is its parent and reaps it; its exit status is asked of the launcher."""

    def __init__(self, pid: int, launcher: Launcher) -> None:
        self.pid = pid
        self._launcher = launcher
        self._start_ticks = process_start_ticks(pid)
        self._exitcode: int | None = None

    def poll(self) -> int | None:
        if self._exitcode is None:
            try:
                self._exitcode = self._launcher.exit_status(self.pid)
            except LauncherError:  # the launcher is gone: the process itself says
                ticks = process_start_ticks(self.pid)
                if ticks is None or ticks != self._start_ticks:
                    self._exitcode = -1  # exited; nobody kept the status
        return self._exitcode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            time.sleep(0.02)
        return code

    def send_signal(self, sig: int) -> None:
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass  # already gone


def stat_fields(stat_line: str) -> list[str]:
    """The fields of a ``/proc/<pid>/stat`` line after the command name, from the
    state (field 3) on: the name in parentheses may hold spaces and ``)``, so the
    line is split after its last ``)``."""
    return stat_line.rsplit(")", 1)[-1].split()


def process_start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat, when the process started (clock ticks after boot);
    None if there is no such process or it has exited (a zombie)."""
    try:
        fields = stat_fields(Path(f"/proc/{pid}/stat").read_text())
        return None if fields[0] == "Z" else int(fields[19])
    except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError, ValueError):
        return None


def _read_line(sock: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("connection closed before a whole answer")
        data += chunk
    return data


def _serve_launcher(
    address: str, ready_file: Path, owner: tuple[int, int] | None = None,
    owner_scratch: Path | None = None,
) -> None:  # fmt: skip
    """The launcher's loop: import, listen, fork on request, reap what it forked; with
    an ``owner`` (pid, start ticks), stop them all and return once it has exited."""
    for module in PRELOADED_MODULES:
        importlib.import_module(module)
    exits: dict[int, int] = {}
    children: set[int] = set()

    def reap(*_: object) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            children.discard(pid)
            exits[pid] = os.waitstatus_to_exitcode(status)

    signal.signal(signal.SIGCHLD, reap)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + address)
    listener.listen(128)
    tmp = ready_file.with_name(f".{ready_file.name}.tmp")
    tmp.write_text(json.dumps({"address": address, "pid": os.getpid()}))
    tmp.replace(ready_file)
    print(f"launcher {os.getpid()} ready on @{address}", flush=True)
    if owner is not None:
        listener.settimeout(OWNER_CHECK_S)  # accept wakes up to look at the owner
    while True:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            if _running(*owner):
                continue
            print(f"launcher: owner {owner[0]} has exited; stopping {len(children)} services",
                  flush=True)  # fmt: skip
            _stop_children(children, reap)
            if owner_scratch is not None:
                shutil.rmtree(owner_scratch, ignore_errors=True)
            return
        with conn:
            try:
                conn.settimeout(_CALL_TIMEOUT_S)
                if _peer_uid(conn) != os.getuid():
                    continue  # only the user who started it may have it fork
                request = json.loads(_read_line(conn))
                if request.get("op") == "fork":
                    answer = _fork_request(request, listener, conn, children)
                elif request.get("op") == "status":
                    reap()
                    pid = int(request["pid"])
                    if pid not in children and pid not in exits:
                        answer = {"error": f"pid {pid} is not a child of this launcher"}
                    else:
                        answer = {"exitcode": exits.get(pid)}
                else:
                    answer = {"error": f"unknown request {request.get('op')!r}"}
                conn.sendall(json.dumps(answer).encode() + b"\n")
            except (OSError, ValueError, KeyError, TypeError) as exc:
                print(f"launcher: bad request: {exc!r}", flush=True)


def _running(pid: int, start_ticks: int) -> bool:
    """``pid`` runs, and is the process that had ``start_ticks`` (0: any); a zombie
    has exited."""
    ticks = process_start_ticks(pid)
    return ticks is not None and (not start_ticks or ticks == start_ticks)


def _stop_children(children: set[int], reap: Callable[[], None]) -> None:
    """SIGTERM each child's process group (each leads its own session), SIGKILL what
    is left after OWNER_STOP_S; ``reap`` takes the exited ones out of ``children``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in list(children):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)
        deadline = time.monotonic() + OWNER_STOP_S
        while children and time.monotonic() < deadline:
            time.sleep(0.05)
            reap()


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def _fork_request(
    request: dict[str, Any], listener: socket.socket, conn: socket.socket, children: set[int]
) -> dict[str, Any]:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():  # never: nothing here touches CUDA
        return {"error": "CUDA is initialised in the launcher; a fork would inherit it"}
    pid = os.fork()
    if pid == 0:  # the child: never returns
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        listener.close()
        conn.close()
        _run_launched(request)
    children.add(pid)
    return {"pid": pid}


def _run_launched(request: dict[str, Any]) -> None:
    """In a child of the launcher: run the module as ``python -m`` would, then exit with
    the status that would have had (atexit handlers included)."""
    code = 1
    try:
        _set_comm(Path(request["log_path"]).stem.removesuffix(".log"))
        _run_module(request["module"], request["argv"], request["log_path"], request["env"],
                    request["cwd"], request.get("netns"))  # fmt: skip
        code = 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _set_comm(name: str) -> None:
    """Name the process ``name`` in ps/top's COMM column (its command line stays the
    launcher's: Python cannot rewrite it without a C extension)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


def _launcher_main(argv: list[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m stalwart.procs",
                                     description="a detached preloaded service launcher")  # fmt: skip
    parser.add_argument("--address", required=True, help="abstract unix socket name")
    parser.add_argument("--ready-file", required=True, type=Path)
    parser.add_argument("--owner", type=_pid_and_ticks, default=None,
                        help="PID:START_TICKS; stop every service forked once it has exited")  # fmt: skip
    parser.add_argument("--owner-scratch", type=Path, default=None,
                        help="a directory to remove then (the run's own store)")  # fmt: skip
    opts = parser.parse_args(argv)
    _serve_launcher(opts.address, opts.ready_file, opts.owner, opts.owner_scratch)


def _pid_and_ticks(text: str) -> tuple[int, int]:
    pid, _, ticks = text.partition(":")
    return int(pid), int(ticks or 0)


if __name__ == "__main__":
    _launcher_main(sys.argv[1:])
