"""Fixtures for the checkpoint integration tests: real paramserver processes
(the paramserver tests' launcher) and real stores on every backend."""

from __future__ import annotations

import pytest

from tests.backends import ignite_url, redis_url, shm_url  # noqa: F401
from tests.integration.paramserver.conftest import launcher  # noqa: F401

BACKENDS = ("shm", "redis", "ignite")


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest) -> str:
    """Each backend in turn, served by a real server (tests/backends.py)."""
    return request.getfixturevalue(f"{request.param}_url")
