"""The Go client against a real paramserver: the wire contract is language-neutral.

Builds clients/go (generate.sh: protoc-gen-go and protoc-gen-go-grpc from the Go
module proxy, driven by grpc_tools.protoc), starts a local cluster (two
coordinators, a paramserver group, a trainer) and a lone paramserver for the raw
round trip, and runs `go test ./...` with STALWART_PARAMSERVER and
STALWART_COORDINATOR pointing at them, under
STALWART_REQUIRE_BACKENDS=1 so no Go test may skip. One Go test runs a job to
the end and writes its final weights; they must equal the Python client's pull,
bitwise. Skips when no Go toolchain is installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.clients_live import (
    assert_same_weights,
    live_cluster,
    standalone_paramserver,
)

GO_DIR = Path(__file__).resolve().parents[2] / "clients" / "go"

pytestmark = pytest.mark.skipif(shutil.which("go") is None, reason="no Go toolchain on PATH")


def _go_env(**extra: str) -> dict[str, str]:
    return dict(os.environ, GOFLAGS="-mod=mod", PYTHON=sys.executable, **extra)


def _run(cmd: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    result = subprocess.run(
        cmd, cwd=GO_DIR, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert result.returncode == 0, f"{' '.join(cmd)} failed:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def go_client() -> Path:
    env = _go_env()
    _run(["bash", "generate.sh"], env, timeout=600)
    _run(["go", "build", "./..."], env, timeout=600)
    return GO_DIR


@pytest.mark.timeout(1200)
def test_go_client_against_live_services(go_client: Path, run_dir: Path) -> None:
    with (
        live_cluster(run_dir, "go-client") as cluster,
        standalone_paramserver(run_dir, "go-client-ps") as lone_paramserver,
    ):
        coordinators = cluster.coordinator_addresses
        dump = run_dir / "go-client-weights.json"
        env = _go_env(
            STALWART_PARAMSERVER=lone_paramserver,
            STALWART_COORDINATOR=",".join(coordinators),
            STALWART_WEIGHTS_OUT=str(dump),
            STALWART_REQUIRE_BACKENDS="1",
        )
        result = _run(["go", "test", "-count=1", "-v", "./..."], env, timeout=900)
        out = result.stdout
        assert "--- PASS: TestParamServerPushPullRoundTrip" in out, out
        assert "--- PASS: TestCoordinatorListAndSubmit" in out, out
        assert "--- PASS: TestCRC32CKnownValues" in out, out
        assert "--- PASS: TestSubmitFollowPull" in out, out
        # the Go client's pull of the final weights equals the Python client's, bitwise
        assert_same_weights(dump, coordinators)
