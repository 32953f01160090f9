"""Fixtures for the paramserver integration tests: real replica processes on loopback.

Every process is started by a :class:`Launcher` (the tests' one launcher,
tests/launcher.py, with replica vocabulary), which stops every process it started
when its fixture ends, whatever the test did to it (SIGKILL, SIGSTOP, restarts).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from stalwart.procs import ServiceProcess
from tests import launcher as launchers
from tests.launcher import ROOT  # noqa: F401 - for the tests here

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


class Launcher(launchers.Launcher):
    """Starts paramserver replicas under one run folder; :meth:`stop_all` ends them all."""

    def __init__(self, run_dir: Path, prefix: str):
        super().__init__(run_dir, prefix, flags=COMMON_FLAGS)

    def start(self, name: str, *args: str) -> ServiceProcess:
        """Start one replica (``--port X`` in args keeps a port across a restart)."""
        return self.launch(MODULE, name, *args)

    def start_many(self, specs: dict[str, Sequence[str]]) -> dict[str, ServiceProcess]:
        """Start several replicas at once (imports dominate start-up, so overlap them)."""
        with ThreadPoolExecutor(len(specs)) as pool:
            futures = {name: pool.submit(self.start, name, *args) for name, args in specs.items()}
        return {name: f.result() for name, f in futures.items()}


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
