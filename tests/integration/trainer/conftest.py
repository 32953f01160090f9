"""Fixtures of the trainer integration tests: paramserver pairs, trainers, coordinators,
all real processes on loopback; ``async def`` tests run in their own event loop."""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from stalwart.procs import ServiceProcess, start_service
from tests.backends import shm_url  # noqa: F401
from tests.helpers import PRELOAD

ROOT = Path(__file__).resolve().parents[3]
FAST = ("--grace-seconds", "2", "--metrics-port", "-1")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    asyncio.run(pyfuncitem.obj(**{n: pyfuncitem.funcargs[n] for n in names}))
    return True


class Procs:
    """Processes of one test; all stopped (SIGCONT, SIGTERM, then SIGKILL) at the end."""

    def __init__(self, run_dir: Path, store_url: str = ""):
        self.run_dir = run_dir
        self.store_url = store_url
        self.prefix = "t" + uuid.uuid4().hex[:8]
        self.procs: list[ServiceProcess] = []

    def start(self, module: str, name: str, *args: str, env=None) -> ServiceProcess:
        proc = start_service(module, [*FAST, "--node-id", name, *args], self.run_dir,
                             f"{self.prefix}-{name}", env=env, cwd=ROOT, timeout=60,
                             preload=PRELOAD)  # fmt: skip
        self.procs.append(proc)
        return proc

    def paramserver_pair(self, name: str = "ps") -> tuple[ServiceProcess, ServiceProcess]:
        backup = self.start("services.paramserver", f"{name}-b", "--role", "backup")
        primary = self.start(
            "services.paramserver", f"{name}-p", "--role", "primary", "--backups", backup.address
        )
        return primary, backup

    def coordinator(self, name: str, *args: str) -> ServiceProcess:
        flags = ["--store-url", self.store_url, "--store-prefix", self.prefix]
        return self.start("services.coordinator", name, *flags, *args)

    def trainer(self, name: str, *args: str, faults: str = "") -> ServiceProcess:
        env = {"STALWART_FAULTS": faults} if faults else None
        return self.start("services.trainer", name, *args, env=env)

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.alive():
                os.killpg(proc.pid, signal.SIGCONT)
                proc.terminate(timeout=10)


@pytest.fixture
def procs(run_dir: Path) -> Iterator[Procs]:
    p = Procs(run_dir / "trainer")
    try:
        yield p
    finally:
        p.stop_all()


@pytest.fixture
def cluster_procs(run_dir: Path, shm_url: str) -> Iterator[Procs]:  # noqa: F811
    p = Procs(run_dir / "trainer", shm_url)
    try:
        yield p
    finally:
        p.stop_all()
