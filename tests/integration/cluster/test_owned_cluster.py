"""A benchmark's or the demo's cluster (``ClusterConfig.stop_with_caller``) does not
outlive the process that started it, however that process ends: its ``finally``
never runs on SIGTERM's default action or kill -9, and the launcher, which outlives
everything by design, stops the services and removes the run's store instead."""

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

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill", "term"])
def test_the_cluster_stops_when_its_caller_dies(tmp_path: Path, sig: signal.Signals):
    owner = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.cluster.owned_cluster_main", str(tmp_path)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    started: dict = {}
    try:
        line = owner.stdout.readline()
        assert line, f"the cluster did not start (exit {owner.wait()})"
        started = json.loads(line)
        processes = [*started["members"], started["launcher"]]
        assert len(started["members"]) == 3  # coordinator, primary, trainer
        assert not any(exited(pid) for pid in processes)
        assert Path(started["store"]).is_dir()

        owner.send_signal(sig)
        assert owner.wait(timeout=30) == -sig
        assert_eventually(lambda: all(exited(pid) for pid in processes), timeout=60)
        assert not Path(started["store"]).exists()
    finally:
        owner.kill()
        for pid in [*started.get("members", []), started.get("launcher")]:
            if pid and not exited(pid):
                os.killpg(pid, signal.SIGKILL)


def test_an_interrupted_start_leaves_nothing(tmp_path: Path, monkeypatch):
    """Ctrl-C (or SIGTERM's unwind in the CLI) while ``stalwart up`` starts the
    services: what was started, the launcher included, is stopped, the store removed."""
    from stalwart import cluster

    launchers: list = []
    real_start = cluster.Launcher.start

    def recorded(*args, **kwargs):
        launchers.append(real_start(*args, **kwargs))
        return launchers[-1]

    def interrupted(local, config) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cluster.Launcher, "start", recorded)
    monkeypatch.setattr(cluster, "_start_everything", interrupted)
    with pytest.raises(KeyboardInterrupt):
        cluster.start(cluster.ClusterConfig(runs_root=tmp_path, launcher=True))
    assert len(launchers) == 1
    assert not launchers[0].alive()
    state = json.loads(next(tmp_path.glob("*/cluster.json")).read_text())
    assert state["stopped_at"] and not Path(state["store_url"].removeprefix("shm://")).exists()
