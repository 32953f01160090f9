"""Fixtures for the store tests: every backend, real servers (see tests/backends.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from stalwart.stores import Store, open_store
from tests.backends import file_url, ignite_url, redis_url, shm_url  # noqa: F401

BACKENDS = ("shm", "file", "redis", "ignite")


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest) -> str:
    """The URL of each backend in turn (the test runs once per backend)."""
    return request.getfixturevalue(f"{request.param}_url")


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    with open_store(store_url) as s:
        yield s


@pytest.fixture
def uniq() -> str:
    """A name no other test uses: backends are shared by the whole session."""
    return "t" + uuid.uuid4().hex[:12]
