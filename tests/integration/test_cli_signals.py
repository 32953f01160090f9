"""A ``stalwart`` command that started services (``bench ps``: four of them, forked
from a launcher it owns, each in a session of its own) leaves none behind however it
ends. SIGTERM unwinds it: the services are stopped on the way out and the command
exits 143 (before, SIGTERM's default action ended it on the spot and the services
served on for good). kill -9 runs no clean-up at all: the launcher sees its owner
gone and stops them (before, they served on)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import assert_eventually, exited

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("ps-backup", "ps-primary", "ps-lone", "echo")  # what bench ps starts
LAUNCHER = "launcher"  # what it forks them from


def _started(tmp: Path) -> dict[str, int]:
    """{process: pid} of the bench's processes that serve (their ready files)."""
    found = {}
    for ready in tmp.glob("stalwart-bench-ps-*/*.ready.json"):
        found[ready.name.removesuffix(".ready.json")] = json.loads(ready.read_text())["pid"]
    return found


@pytest.mark.parametrize(
    ("sig", "exit_code"),
    [(signal.SIGTERM, 128 + signal.SIGTERM), (signal.SIGKILL, -signal.SIGKILL)],
    ids=["sigterm", "sigkill"],
)
def test_a_command_ended_by_a_signal_leaves_no_service(
    tmp_path: Path, sig: signal.Signals, exit_code: int
) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # where bench ps makes its run folder
    command = [sys.executable, "-m", "stalwart.cli.main", "bench", "ps",
               "--model-mib", "1", "--repeats", "1000000"]  # fmt: skip
    bench = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    pids: dict[str, int] = {}
    try:
        expected = {*SERVICES, LAUNCHER}
        assert_eventually(lambda: set(_started(tmp_path)) == expected, timeout=240)
        pids = _started(tmp_path)
        assert not any(exited(pid) for pid in pids.values())

        bench.send_signal(sig)
        assert bench.wait(timeout=60) == exit_code, bench.stderr.read()
        assert_eventually(lambda: [n for n, pid in pids.items() if not exited(pid)] == [],
                          timeout=60)  # fmt: skip
    finally:
        bench.kill()
        for pid in pids.values():
            if not exited(pid):
                os.killpg(pid, signal.SIGKILL)
