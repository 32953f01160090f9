"""``stalwart top --once`` against a live coordinator: one frame with the leader, every
registered node, the job and the recent events; ``-o json`` the same as data."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stalwart.api import common
from stalwart.client import CoordinatorClient
from tests.backends import shm_url  # noqa: F401
from tests.integration.coordinator.support import job_spec, wait_leader
from tests.launcher import Launcher

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def launcher(run_dir: Path) -> Iterator[Launcher]:
    launch = Launcher(run_dir / "top", flags=("--grace-seconds", "2", "--metrics-port", "-1"),
                      timeout=90)  # fmt: skip
    try:
        yield launch
    finally:
        launch.stop_all()


def top(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stalwart.cli.main", "top", "--once", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip


async def registered(address: str, node_ids: set[str]) -> None:
    async with CoordinatorClient(address) as client:
        deadline = time.monotonic() + 60
        while {n.node_id for n in await client.all_nodes()} != node_ids:
            assert time.monotonic() < deadline, "trainers did not register"
            await asyncio.sleep(0.2)
        await client.create_job(job_spec(num_slots=1, steps=5), job_id="top-job")


def test_top_once_shows_the_cluster(launcher, shm_url):  # noqa: F811
    coord = launcher.launch("services.coordinator", "c1", "--node-id", "c1",
                            "--store-url", shm_url, "--store-prefix", launcher.prefix)  # fmt: skip
    asyncio.run(wait_leader(coord.address))
    join = ("--coordinator", coord.address)
    launcher.launch("services.trainer", "top-tr0", "--node-id", "top-tr0", *join)
    launcher.launch("services.trainer", "top-sb", "--node-id", "top-sb", *join, "--standby")
    asyncio.run(registered(coord.address, {"top-tr0", "top-sb"}))

    shown = top("--coordinator", coord.address)
    assert shown.returncode == 0, shown.stderr
    frame = shown.stdout
    for expected in ("leader c1 at", "epoch 1", "top-tr0", "top-sb", "top-job", "trainer",
                     "recent events", "registered"):  # fmt: skip
        assert expected in frame, f"{expected!r} missing from:\n{frame}"

    data = json.loads(top("--coordinator", coord.address, "-o", "json").stdout)
    assert data["status"]["is_leader"] and data["status"]["leader_id"] == "c1"
    assert {n["node_id"] for n in data["nodes"]} == {"top-tr0", "top-sb"}
    assert [j["job_id"] for j in data["jobs"]] == ["top-job"]
    assert data["risks"] is None  # no --health given
    kinds = {e["kind"] for e in data["events"]}
    assert common.EventKind.Name(common.EVENT_KIND_NODE_REGISTERED) in kinds

    # piped, the live view prints frame after frame (it used to print nothing at all)
    assert _frames_piped(coord.address, 2) == 2


def _frames_piped(address: str, wanted: int) -> int:
    """How many whole frames a piped `stalwart top` printed, reading until ``wanted``."""
    proc = subprocess.Popen([sys.executable, "-m", "stalwart.cli.main", "top", "--interval",
                             "0.2", "--coordinator", address], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)  # fmt: skip
    frames = 0
    stop = threading.Timer(60, proc.kill)  # a top that prints nothing ends the read
    stop.start()
    try:
        for line in proc.stdout:
            frames += "leader c1 at" in line
            if frames == wanted:
                break
    finally:
        stop.cancel()
        proc.kill()
        proc.wait(timeout=30)
    return frames


def test_top_without_a_cluster_says_so_in_one_line(tmp_path):
    shown = top("--run-dir", str(tmp_path / "none"))
    assert shown.returncode == 3  # ExitCode.UNREACHABLE
    assert shown.stderr.startswith("Error: ") and shown.stderr.count("\n") == 1, shown.stderr
