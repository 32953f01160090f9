"""Shared pytest configuration for every test under tests/.

Kept minimal on purpose: backend fixtures (Redis, Ignite) live in tests/backends.py,
fixtures of one area live next to its tests.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import sys
from pathlib import Path

import pytest

# One intra-op thread per process: test machines have two cores and integration tests run
# several processes at once. Set before anything imports torch, and inherited by the
# processes the tests start; an explicit setting in the environment wins.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

_TESTS = Path(__file__).resolve().parent
# Tests in these folders get the marker of the same name, so `-m "not chaos"` works
# without each module repeating it (the markers are declared in pyproject.toml).
_FOLDER_MARKERS = ("integration", "chaos")


def pytest_sessionstart(session: pytest.Session) -> None:
    torch = sys.modules.get("torch")  # only if something already imported it
    if torch is not None:
        torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        try:
            folder = Path(str(item.path)).resolve().relative_to(_TESTS).parts[0]
        except (ValueError, IndexError):
            continue
        if folder in _FOLDER_MARKERS:
            item.add_marker(folder)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run each ``async def`` test with :func:`asyncio.run`, in a loop of its own (gRPC aio
    channels belong to the loop that opened them, so no loop is shared between tests)."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    asyncio.run(pyfuncitem.obj(**{n: pyfuncitem.funcargs[n] for n in names}))
    return True


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder for the logs and data of processes started during this test session.

    `$STALWART_RUN_DIR` when set (e.g. to keep logs after a CI run), else a fresh
    temporary folder.
    """
    env = os.environ.get("STALWART_RUN_DIR")
    if env:
        path = Path(env).resolve()
        path.mkdir(parents=True, exist_ok=True)
        return path
    return tmp_path_factory.mktemp("run")
