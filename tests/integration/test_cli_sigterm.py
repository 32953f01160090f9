"""SIGTERM to a ``stalwart`` command that started services (``bench ps``: four of
them, fresh interpreters in sessions of their own) unwinds it: the services are
stopped on the way out and the command exits 143. Before, SIGTERM's default action
ended the command on the spot and the services served on for good."""

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


def _started(tmp: Path) -> dict[str, int]:
    """{service: pid} of the bench's services that serve (their ready files)."""
    found = {}
    for ready in tmp.glob("stalwart-bench-ps-*/*.ready.json"):
        found[ready.name.removesuffix(".ready.json")] = json.loads(ready.read_text())["pid"]
    return found


def test_sigterm_stops_the_services_a_command_started(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # where bench ps makes its run folder
    command = [sys.executable, "-m", "stalwart.cli.main", "bench", "ps",
               "--model-mib", "1", "--repeats", "1000000"]  # fmt: skip
    bench = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    pids: dict[str, int] = {}
    try:
        assert_eventually(lambda: set(_started(tmp_path)) == set(SERVICES), timeout=240)
        pids = _started(tmp_path)
        assert not any(exited(pid) for pid in pids.values())

        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=60) == 128 + signal.SIGTERM, bench.stderr.read()
        assert [name for name, pid in pids.items() if not exited(pid)] == []
    finally:
        bench.kill()
        for pid in pids.values():
            if not exited(pid):
                os.killpg(pid, signal.SIGKILL)
