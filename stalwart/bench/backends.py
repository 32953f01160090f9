"""Redis and Ignite servers for a benchmark run, started with the project's scripts.

``scripts/backends/{redis,ignite}.sh start DIR`` prints the server's URL;
``stop DIR`` ends it. The scripts also stop the server on their own if the
process named by ``STALWART_BACKEND_OWNER_PID`` dies first.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts" / "backends"
START_TIMEOUT_S = {"redis": 300.0, "ignite": 600.0}  # the first Ignite start may build with Maven


class BackendError(RuntimeError):
    """A server could not be started; the message says why, in one line."""


def _script(kind: str, action: str, directory: Path, timeout: float) -> str:
    env = {**os.environ, "STALWART_BACKEND_OWNER_PID": str(os.getpid())}
    try:
        proc = subprocess.run([str(SCRIPTS / f"{kind}.sh"), action, str(directory)],
                              capture_output=True, text=True, timeout=timeout, env=env, check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        raise BackendError(f"{kind}.sh {action} did not finish in {timeout:.0f}s") from None
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        raise BackendError(f"{kind}.sh {action} failed: {lines[-1] if lines else proc.returncode}")
    lines = proc.stdout.strip().splitlines()
    return lines[-1] if lines else ""  # start prints the URL last; stop prints nothing


@contextlib.contextmanager
def started(kind: str) -> Iterator[str]:
    """A fresh ``kind`` ("redis" or "ignite") server in a temp folder; yields its URL."""
    directory = Path(tempfile.mkdtemp(prefix=f"stalwart-bench-{kind}-"))
    url = _script(kind, "start", directory, START_TIMEOUT_S[kind])
    try:
        if not url:
            raise BackendError(f"{kind}.sh start printed no URL")
        yield url
    finally:
        with contextlib.suppress(BackendError):
            _script(kind, "stop", directory, 120.0)
