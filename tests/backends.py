"""Real store backends for tests: session-scoped pytest fixtures, reusable anywhere.

Use them from any conftest.py::

    from tests.backends import file_url, ignite_url, redis_url, shm_url  # noqa: F401

``redis_url`` / ``ignite_url`` start a real server once per test session with
``scripts/backends/{redis,ignite}.sh`` on free loopback ports and stop it at the
end. When a server cannot be had (no redis-server and not root to install it;
no Java or Maven) the test is skipped with a one-line reason, or fails with that
reason when ``STALWART_REQUIRE_BACKENDS=1`` (``make test`` / CI set it).

``STALWART_TEST_REDIS_URL`` / ``STALWART_TEST_IGNITE_URL`` point the fixtures at
servers that are already running (compose, CI services) instead of starting any.
``STALWART_TEST_IGNITE_NODES`` (default 1) starts that many Ignite nodes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "scripts" / "backends"
REQUIRE_ENV = "STALWART_REQUIRE_BACKENDS"


class BackendUnavailable(RuntimeError):
    """A backend server could not be started; the message says why, in one line."""


def backends_required() -> bool:
    return os.environ.get(REQUIRE_ENV, "") == "1"


def skip_or_fail(reason: str) -> None:
    """Skip the test, or fail it when STALWART_REQUIRE_BACKENDS=1."""
    if backends_required():
        pytest.fail(f"{reason} ({REQUIRE_ENV}=1)", pytrace=False)
    pytest.skip(reason)


def _script(name: str, *args: str, timeout: float) -> str:
    cmd = [str(SCRIPTS / name), *args]
    try:
        # The scripts stop the server on their own if this process dies without stopping it.
        env = {**os.environ, "STALWART_BACKEND_OWNER_PID": str(os.getpid())}
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, check=False, env=env
        )
    except subprocess.TimeoutExpired:
        raise BackendUnavailable(f"{name} {args[0]} did not finish in {timeout:.0f}s") from None
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        why = lines[-1] if lines else f"exit status {proc.returncode}"
        raise BackendUnavailable(f"{name} {args[0]} failed: {why}")
    return proc.stdout.strip()


def start_redis(directory: str | Path) -> str:
    """Start redis-server in ``directory``; return its redis:// URL."""
    return _script("redis.sh", "start", str(directory), timeout=300).splitlines()[-1]


def stop_redis(directory: str | Path) -> None:
    _script("redis.sh", "stop", str(directory), timeout=60)


def start_ignite(directory: str | Path, nodes: int = 1) -> str:
    """Start ``nodes`` Ignite server nodes in ``directory``; return the ignite:// URL.

    The first call may build deploy/ignite with Maven (a minute or two, once).
    """
    return _script("ignite.sh", "start", str(directory), str(nodes), timeout=600).splitlines()[-1]


def stop_ignite(directory: str | Path) -> None:
    _script("ignite.sh", "stop", str(directory), timeout=120)


def _server(kind: str, start, stop, tmp_path_factory) -> Iterator[str]:  # noqa: ANN001
    external = os.environ.get(f"STALWART_TEST_{kind.upper()}_URL")
    if external:
        yield external
        return
    directory = tmp_path_factory.mktemp(f"{kind}-server")
    try:
        url = start(directory)
    except BackendUnavailable as e:
        reason = f"no {kind} server: {e}"
    else:
        reason = ""
    if reason:
        skip_or_fail(reason)  # outside the except: a one-line reason, no chained traceback
        return
    try:
        yield url
    finally:
        stop(directory)


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a real Redis server for this test session (database 0)."""
    yield from _server("redis", start_redis, stop_redis, tmp_path_factory)


@pytest.fixture(scope="session")
def ignite_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a real Apache Ignite cluster (1 node unless STALWART_TEST_IGNITE_NODES)."""
    nodes = int(os.environ.get("STALWART_TEST_IGNITE_NODES", "1"))
    yield from _server("ignite", lambda d: start_ignite(d, nodes), stop_ignite, tmp_path_factory)


@pytest.fixture(scope="session")
def shm_url() -> Iterator[str]:
    """A fresh shm:// store directory under /dev/shm (a temp dir where there is none)."""
    parent = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    directory = tempfile.mkdtemp(prefix="stalwart-test-", dir=parent)
    try:
        yield f"shm://{directory}"
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def file_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A fresh file:// store directory on disk."""
    return f"file://{tmp_path_factory.mktemp('file-store')}"
