"""Fixtures for the coordinator integration tests: real coordinator (and paramserver)
processes on loopback sharing one store (started by the tests' one launcher)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from stalwart.procs import ServiceProcess
from tests.backends import redis_url, shm_url  # noqa: F401
from tests.launcher import ROOT, Launcher  # noqa: F401 - ROOT for the tests here

FAST = ("--grace-seconds", "1", "--metrics-port", "-1", "--log-level", "info")


class Cluster(Launcher):
    """Processes of one test; every one is stopped (even if SIGSTOPped) at the end."""

    def __init__(self, run_dir: Path, store_url: str) -> None:
        super().__init__(run_dir, flags=FAST)
        self.store_url = store_url  # shared: the prefix keeps this test's keys apart

    def coordinator(self, name: str, *args: str) -> ServiceProcess:
        flags = ["--store-url", self.store_url, "--store-prefix", self.prefix, "--node-id", name]
        return self.launch("services.coordinator", name, *flags, *args)

    def paramserver(self, name: str, *args: str) -> ServiceProcess:
        return self.launch("services.paramserver", name, "--node-id", name, *args)


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
