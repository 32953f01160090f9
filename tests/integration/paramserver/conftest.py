"""Fixtures for the paramserver integration tests: real replica processes on loopback.

Every process is started through :func:`stalwart.procs.start_service` by a
:class:`Launcher`, which stops every process it started when its fixture ends,
whatever the test did to it (SIGKILL, SIGSTOP, restarts).

Tests here are ``async def``: the small hook below runs each in its own event
loop (gRPC aio channels belong to the loop that opened them).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import re
import signal
import subprocess
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from stalwart.procs import ServiceProcess, start_service
from tests.helpers import PRELOAD

ROOT = Path(__file__).resolve().parents[3]
MODULE = "services.paramserver"
# Small limits, so that the oversize inputs stay small too (see test_bad_input.py).
MAX_MESSAGE_BYTES = 256 * 1024
MAX_STREAM_BYTES = 1024 * 1024
COMMON_FLAGS = ("--grace-seconds", "1")
SHARED_FLAGS = (
    "--max-message-bytes", str(MAX_MESSAGE_BYTES),
    "--chunk-bytes", str(128 * 1024),
    "--max-stream-bytes", str(MAX_STREAM_BYTES),
)  # fmt: skip


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run ``async def`` tests of this folder with :func:`asyncio.run`."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    asyncio.run(pyfuncitem.obj(**{n: pyfuncitem.funcargs[n] for n in names}))
    return True


class Launcher:
    """Starts paramserver replicas under one run folder; :meth:`stop_all` ends them all."""

    def __init__(self, run_dir: Path, prefix: str):
        self.run_dir = run_dir
        self.prefix = prefix
        self.procs: list[ServiceProcess] = []

    def start(self, name: str, *args: str) -> ServiceProcess:
        """Start one replica (``--port X`` in args keeps a port across a restart)."""
        proc = start_service(
            MODULE,
            [*COMMON_FLAGS, *args],
            self.run_dir,
            f"{self.prefix}-{name}",
            timeout=60,
            cwd=ROOT,
            preload=PRELOAD,
        )
        self.procs.append(proc)
        return proc

    def start_many(self, specs: dict[str, Sequence[str]]) -> dict[str, ServiceProcess]:
        """Start several replicas at once (imports dominate start-up, so overlap them)."""
        with ThreadPoolExecutor(len(specs)) as pool:
            futures = {name: pool.submit(self.start, name, *args) for name, args in specs.items()}
        return {name: f.result() for name, f in futures.items()}

    def stop_all(self) -> None:
        """SIGCONT (a stopped process ignores SIGTERM), SIGTERM all, then reap or SIGKILL."""
        alive = [p for p in self.procs if p.alive()]
        for proc in alive:
            for sig in (signal.SIGCONT, signal.SIGTERM):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    pass
        for proc in alive:
            try:
                proc.popen.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.procs.clear()


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[:60]


@pytest.fixture
def launcher(run_dir: Path, request: pytest.FixtureRequest) -> Iterator[Launcher]:
    """A launcher for one test; every process it started is stopped afterwards."""
    launch = Launcher(run_dir / "ps-integration", _slug(request.node.name))
    try:
        yield launch
    finally:
        launch.stop_all()


@dataclass(frozen=True)
class Group:
    """One shard group: a primary and its backup."""

    primary: ServiceProcess
    backup: ServiceProcess

    @property
    def addresses(self) -> list[str]:
        return [self.primary.address, self.backup.address]

    @property
    def replicas(self) -> list[ServiceProcess]:
        return [self.primary, self.backup]


@pytest.fixture(scope="session")
def shared_groups(run_dir: Path) -> Iterator[list[Group]]:
    """Two shard groups (primary + backup each, epoch 1, small limits) for the tests
    that do not kill anything. Each test uses its own job ids."""
    launch = Launcher(run_dir / "ps-integration", "shared")
    try:
        backups = launch.start_many({f"b{i}": ["--role", "backup", *SHARED_FLAGS] for i in (0, 1)})
        primaries = launch.start_many(
            {
                f"p{i}": [
                    "--role",
                    "primary",
                    "--backups",
                    backups[f"b{i}"].address,
                    "--shard",
                    str(i),
                    *SHARED_FLAGS,
                ]
                for i in (0, 1)
            }  # fmt: skip
        )
        yield [Group(primaries[f"p{i}"], backups[f"b{i}"]) for i in (0, 1)]
    finally:
        launch.stop_all()
