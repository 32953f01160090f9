"""The CLI end to end: ``stalwart up``, a job to completion, bad input, ``down``, and the
one-line error a stopped cluster gets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[3]
EXIT_INVALID_INPUT, EXIT_UNREACHABLE = 2, 3  # stalwart.cli.output.ExitCode


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
    finally:
        down = stalwart("down", *target)
    assert down.returncode == 0, down.stderr
    pids = [m["pid"] for m in state["members"]]
    assert not [p for p in pids if Path(f"/proc/{p}").exists()
                and "Z" not in Path(f"/proc/{p}/stat").read_text().split(")")[-1][:3]]  # fmt: skip

    stopped = stalwart("status", *target)
    assert stopped.returncode == EXIT_UNREACHABLE
    assert "stopped" in one_error_line(stopped)
    # the same cluster named by its (now closed) addresses
    refused = stalwart("nodes", "-c", ",".join(state["coordinators"]), "--timeout", "1")
    assert refused.returncode == EXIT_UNREACHABLE
    assert "cannot reach the cluster" in one_error_line(refused)


def test_help_everywhere():
    for args in (["--help"], ["up", "--help"], ["job", "submit", "--help"], ["demo", "--help"],
                 ["bench", "--help"], ["failover", "--help"], ["drain", "--help"],
                 ["health", "--help"]):  # fmt: skip
        result = stalwart(*args)
        assert result.returncode == 0, (args, result.stderr)
        assert "Usage" in result.stdout
