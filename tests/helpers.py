"""Small helpers shared by tests: wait for a condition instead of sleeping; tell
whether a process has exited."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

# Start test services by forking a server that has torch and grpc imported
# (stalwart.procs, preload=True) instead of a fresh interpreter each time: the
# same code runs, seconds sooner. STALWART_TEST_PRELOAD=0 starts them plainly.
PRELOAD = os.environ.get("STALWART_TEST_PRELOAD", "1") != "0"


def assert_eventually(
    fn: Callable[[], T], timeout: float = 10.0, interval: float = 0.05, message: str = ""
) -> T:
    """Call ``fn`` until it neither raises AssertionError nor returns a falsy value.

    ``None`` counts as success, so a check written as bare ``assert`` statements
    works as well as a predicate. Returns the last result. On timeout it fails
    with the last AssertionError (or falsy value), so the output says what was
    still wrong.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = fn()
            if result is None or result:
                return result
            last: BaseException = AssertionError(f"{message or fn} returned {result!r}")
        except AssertionError as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise AssertionError(f"not true after {timeout}s: {last}") from last
        time.sleep(interval)


async def assert_eventually_async(
    fn: Callable[[], Awaitable[T]], timeout: float = 10.0, interval: float = 0.05, message: str = ""
) -> T:
    """The asyncio twin of :func:`assert_eventually` for coroutine conditions."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = await fn()
            if result is None or result:
                return result
            last: BaseException = AssertionError(f"{message or fn} returned {result!r}")
        except AssertionError as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise AssertionError(f"not true after {timeout}s: {last}") from last
        await asyncio.sleep(interval)


def exited(pid: int) -> bool:
    """The process has exited: gone, or a zombie its parent has not reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True
