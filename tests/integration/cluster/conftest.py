"""Fixtures of the local-cluster tests: one cluster of real processes shared by a module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from stalwart import cluster
from tests.integration.cluster.support import running_cluster


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cluster.LocalCluster]:
    """2 coordinators, a paramserver primary + backup, 2 trainers and 2 warm standbys.

    Tests that kill members leave the rest for the next test: each kill test needs
    only what it kills to exist once (a slot trainer with a standby behind it, a
    primary with a backup, a leader with a standby replica).
    """
    with running_cluster(Path(tmp_path_factory.mktemp("runs")), trainers=2, standbys=2) as started:
        yield started
