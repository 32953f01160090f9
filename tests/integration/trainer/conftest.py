"""Fixtures of the trainer integration tests: paramserver pairs, trainers, coordinators,
all real processes on loopback, started by the tests' one launcher."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from stalwart.procs import ServiceProcess
from tests.backends import shm_url  # noqa: F401
from tests.launcher import ROOT, Launcher  # noqa: F401 - ROOT for the tests here

FAST = ("--grace-seconds", "2", "--metrics-port", "-1")


class Procs(Launcher):
    """Processes of one test; all stopped (SIGCONT, SIGTERM, then SIGKILL) at the end."""

    def __init__(self, run_dir: Path, store_url: str = ""):
        super().__init__(run_dir, flags=FAST)
        self.store_url = store_url

    def start(self, module: str, name: str, *args: str, env=None) -> ServiceProcess:
        return self.launch(module, name, "--node-id", name, *args, env=env)

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
