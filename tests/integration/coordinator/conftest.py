"""Fixtures for the coordinator integration tests: real coordinator (and paramserver)
processes on loopback sharing one store; ``async def`` tests run in their own loop."""

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
from tests.backends import redis_url, shm_url  # noqa: F401
from tests.helpers import PRELOAD

ROOT = Path(__file__).resolve().parents[3]
FAST = ("--grace-seconds", "1", "--metrics-port", "-1", "--log-level", "info")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run ``async def`` tests of this folder with :func:`asyncio.run`."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    asyncio.run(pyfuncitem.obj(**{n: pyfuncitem.funcargs[n] for n in names}))
    return True


class Cluster:
    """Processes of one test; every one is stopped (even if SIGSTOPped) at the end."""

    def __init__(self, run_dir: Path, store_url: str) -> None:
        self.run_dir = run_dir
        self.store_url = store_url
        self.prefix = "t" + uuid.uuid4().hex[:8]  # keys of this test only, in a shared store
        self.procs: list[ServiceProcess] = []

    def coordinator(self, name: str, *args: str) -> ServiceProcess:
        flags = ["--store-url", self.store_url, "--store-prefix", self.prefix, "--node-id", name]
        return self._start("services.coordinator", name, *flags, *args)

    def paramserver(self, name: str, *args: str) -> ServiceProcess:
        return self._start("services.paramserver", name, "--node-id", name, *args)

    def _start(self, module: str, name: str, *args: str) -> ServiceProcess:
        proc = start_service(module, [*FAST, *args], self.run_dir, f"{self.prefix}-{name}",
                             cwd=ROOT, timeout=60, preload=PRELOAD)  # fmt: skip
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.alive():
                os.killpg(proc.pid, signal.SIGCONT)  # a stopped process cannot handle SIGTERM
                proc.terminate(timeout=5)


@pytest.fixture
def cluster(run_dir: Path, shm_url: str) -> Iterator[Cluster]:  # noqa: F811
    c = Cluster(run_dir, shm_url)
    try:
        yield c
    finally:
        c.stop_all()


@pytest.fixture
def redis_cluster(run_dir: Path, redis_url: str) -> Iterator[Cluster]:  # noqa: F811
    c = Cluster(run_dir, redis_url)
    try:
        yield c
    finally:
        c.stop_all()
