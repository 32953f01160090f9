"""The CLI end to end: ``stalwart up``, a job to completion, bad input, ``down``, and the
one-line error a stopped cluster gets; the services ``up`` forks from its launcher."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import assert_eventually, exited

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[3]
EXIT_FAILED, EXIT_INVALID_INPUT, EXIT_UNREACHABLE = 1, 2, 3  # stalwart.cli.output.ExitCode


def stalwart(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "stalwart.cli.main", *args],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env,
    )  # fmt: skip


def one_error_line(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: ")
    return lines[0]


@pytest.mark.timeout(600)  # stalwart up starts ten processes on a loaded machine
def test_up_submit_status_down_then_refused(tmp_path: Path):
    runs = tmp_path / "runs"
    up = stalwart("up", "--trainers", "2", "--standbys", "0", "--runs-root", str(runs),
                  "-o", "json", timeout=420)  # fmt: skip
    assert up.returncode == 0, up.stderr
    state = json.loads(up.stdout)
    run_dir = state["run_dir"]
    assert (runs / "latest").resolve() == Path(run_dir)
    assert len(state["coordinators"]) == 2
    roles = {"coordinator", "paramserver", "trainer", "health"}  # health is on by default
    assert {m["role"] for m in state["members"]} == roles
    assert state["health"] == next(m["address"] for m in state["members"] if m["role"] == "health")
    target = ("--run-dir", run_dir)
    try:
        submit = stalwart("job", "submit", "--slots", "2", "--steps", "15", "--batch-size", "16",
                          "--arg", "width=8", "--wait", "-o", "json", *target)  # fmt: skip
        assert submit.returncode == 0, submit.stderr
        job = json.loads(submit.stdout)
        assert job["state"] == "JOB_STATE_SUCCEEDED" and int(job["step"]) == 15

        status = stalwart("status", "-o", "json", *target)
        assert status.returncode == 0, status.stderr
        data = json.loads(status.stdout)
        assert data["epoch"] >= 1 and data["leader_address"] in state["coordinators"]
        assert sum(r["is_leader"] for r in data["replicas"]) == 1
        assert any(j["job_id"] == job["job_id"] for j in data["jobs"])
        assert len(data["nodes"]) == 6  # primary, backup, warm spare, 2 trainers, health

        # The trainers streamed telemetry to it: `stalwart health` finds it through the
        # coordinators and lists each trainer's risk.
        risks = stalwart("health", "-o", "json", *target)
        assert risks.returncode == 0, risks.stderr
        by_node = {r["node_id"]: r for r in json.loads(risks.stdout)}
        assert {"trainer-0", "trainer-1"} <= set(by_node)
        for r in by_node.values():
            assert 0.0 <= r["risk"] <= 1.0 and isinstance(r["top_signals"], list)
            assert r["predicted_lead_time_seconds"] is None  # nothing is failing
        table = stalwart("health", *target)
        assert table.returncode == 0 and "trainer-0" in table.stdout and "lead time" in table.stdout

        table = stalwart("jobs", *target)
        assert table.returncode == 0 and job["job_id"] in table.stdout

        over = stalwart("failover", "-o", "json", *target)
        assert over.returncode == 0, over.stderr
        moved = json.loads(over.stdout)
        assert moved["new_epoch"] > moved["old_epoch"] and moved["new_leader"], moved
        status = json.loads(stalwart("status", "-o", "json", *target).stdout)
        assert status["leader_id"] == moved["new_leader"], status

        # each slot's push is staged on the paramservers, whose budget on one shared
        # machine is a quarter of it: 1,000 slots of the default mlp (13 GB staged)
        # are refused at registration; they used to take the cluster down with them
        many = stalwart("job", "submit", "--model", "mlp", "--slots", "1000", "--steps", "3",
                        "--wait", "-o", "json", *target, timeout=240)  # fmt: skip
        assert many.returncode == EXIT_FAILED, many.stderr
        failed = json.loads(many.stdout)
        assert failed["state"] == "JOB_STATE_FAILED", failed
        assert "ModelTooLarge: the model needs about " in failed["reason"], failed["reason"]

        bad = stalwart("job", "submit", "--slots", "-1", *target)
        assert bad.returncode == EXIT_INVALID_INPUT
        line = one_error_line(bad)
        assert "INVALID_ARGUMENT" in line and "num_slots must be >= 1" in line

        bad = stalwart("job", "submit", "--model", "no-such-model", *target)
        assert bad.returncode == EXIT_INVALID_INPUT
        assert "unknown model" in one_error_line(bad)

        bad = stalwart("job", "submit", "--optimizer", "sgd", "--momentum", "1.5", *target)
        assert bad.returncode == EXIT_INVALID_INPUT
        assert "momentum" in one_error_line(bad)

        # a second up would move `latest` off this cluster, which no down would reach then
        again = stalwart("up", "--runs-root", str(runs))
        assert again.returncode == EXIT_INVALID_INPUT
        assert f"a cluster is already up in {run_dir}" in one_error_line(again)
        assert (runs / "latest").resolve() == Path(run_dir)
    finally:
        down = stalwart("down", *target)
    assert down.returncode == 0, down.stderr
    assert f"stopped {len(state['members'])} of the {len(state['members'])} processes" in (
        down.stdout
    )
    assert "nothing was running" in stalwart("down", *target).stdout
    pids = [m["pid"] for m in state["members"]]
    assert [p for p in pids if not exited(p)] == []

    stopped = stalwart("status", *target)
    assert stopped.returncode == EXIT_UNREACHABLE
    assert "stopped" in one_error_line(stopped)
    # the same cluster named by its (now closed) addresses
    refused = stalwart("nodes", "-c", ",".join(state["coordinators"]), "--timeout", "1")
    assert refused.returncode == EXIT_UNREACHABLE
    assert "cannot reach the cluster" in one_error_line(refused)


def test_help_everywhere():
    for args in (["--help"], ["up", "--help"], ["job", "submit", "--help"], ["demo", "--help"],
                 ["bench", "--help"], ["failover", "--help"], ["drain", "--help"], ["undrain", "--help"],
                 ["health", "--help"]):  # fmt: skip
        result = stalwart(*args)
        assert result.returncode == 0, (args, result.stderr)
        assert "Usage" in result.stdout


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[1])


def _gone(pid: int) -> bool:
    """Exited and reaped (a zombie would mean nobody waits for it)."""
    return not Path(f"/proc/{pid}").exists()


def _holding(address: str) -> list[int]:
    """Pids whose command line names the launcher's socket: it and every fork of it."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and address.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return found


@pytest.mark.timeout(600)
def test_up_forks_from_its_launcher_and_down_leaves_nothing(tmp_path: Path):
    """``stalwart up`` forks every service from the run's detached launcher; a forked
    service is its own session and dies with its children on kill -9 of its group; the
    launcher reaps what dies; ``down`` stops the members, then the launcher."""
    from stalwart import cluster
    from stalwart.procs import start_service

    up = stalwart("up", "--trainers", "1", "--standbys", "0", "--backups", "0", "--no-health",
                  "--runs-root", str(tmp_path / "runs"), "-o", "json", timeout=420)  # fmt: skip
    assert up.returncode == 0, up.stderr
    state = json.loads(up.stdout)
    launcher = state["launcher"]
    assert launcher is not None and Path(launcher["log"]).is_file()
    run_dir = Path(state["run_dir"])
    extra: list[int] = []
    try:
        assert _ppid(launcher["pid"]) != os.getpid()  # `up` has exited; the launcher lives
        assert os.getsid(launcher["pid"]) == launcher["pid"]
        members = {m["name"]: m["pid"] for m in state["members"]}
        assert set(members) == {"coord-0", "coord-1", "ps-0a", "ps-0b", "trainer-0"}
        for pid in members.values():
            assert _ppid(pid) == launcher["pid"]  # forked by it, not a fresh interpreter
            assert os.getsid(pid) == pid and os.getpgid(pid) == pid
        assert set(_holding(launcher["address"])) == {launcher["pid"], *members.values()}

        # A later command (this test, from the state file) forks one more from the same
        # launcher; kill -9 of its group takes its child with it, and the launcher reaps it.
        local = cluster.load(run_dir)
        assert local.launcher is not None and local.launcher.pid == launcher["pid"]
        proc = start_service("tests.integration.cluster.group_child_service", [],
                             local.log_dir, "group-child", cwd=ROOT,
                             launcher=local.launcher)  # fmt: skip
        extra = [proc.pid, proc.ready["child"]]
        assert proc.ready["pgid"] == proc.pid == proc.ready["sid"]
        assert _ppid(proc.pid) == launcher["pid"] and proc.alive()
        assert proc.kill() == -9
        assert_eventually(lambda: _gone(proc.pid) and _gone(proc.ready["child"]), timeout=10)

        # kill -9 of a forked trainer's group: it exits and is reaped, the rest serve on
        os.killpg(members["trainer-0"], 9)
        assert_eventually(lambda: _gone(members["trainer-0"]), timeout=10)
        assert not cluster.load(run_dir).alive("trainer-0")
        assert cluster.load(run_dir).alive("coord-0")
    finally:
        down = stalwart("down", "--run-dir", str(run_dir))
        for pid in extra:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
    assert down.returncode == 0, down.stderr
    assert json.loads((run_dir / "cluster.json").read_text())["stopped_at"]
    # Whoever reaps them now (the launcher went last, its parent `up` long ago) may
    # leave a zombie for a moment: exited is what counts.
    assert_eventually(lambda: not [p for p in _holding(launcher["address"]) if not exited(p)],
                      timeout=10)  # fmt: skip
    assert all(exited(p) for p in [launcher["pid"], *members.values()])
