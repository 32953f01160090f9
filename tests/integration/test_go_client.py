"""The Go client against a real paramserver: the wire contract is language-neutral.

Builds clients/go (generate.sh: protoc-gen-go and protoc-gen-go-grpc from the Go
module proxy, driven by grpc_tools.protoc), starts a paramserver primary, and
a coordinator (shm:// store), and runs `go test ./...` with STALWART_PARAMSERVER
and STALWART_COORDINATOR pointing at them, under STALWART_REQUIRE_BACKENDS=1 so
no Go test may skip. Skips when no Go toolchain is installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stalwart.procs import start_service

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


@pytest.mark.timeout(900)
def test_go_client_against_live_services(go_client: Path, run_dir: Path) -> None:
    store = f"shm://{run_dir / 'go-client-store'}"
    with (
        start_service("services.paramserver", ["--role", "primary"], run_dir, "go-ps") as ps,
        start_service("services.coordinator", ["--store-url", store], run_dir, "go-coord") as co,
    ):
        env = _go_env(
            STALWART_PARAMSERVER=ps.address,
            STALWART_COORDINATOR=co.address,
            STALWART_REQUIRE_BACKENDS="1",
        )
        result = _run(["go", "test", "-count=1", "-v", "./..."], env, timeout=600)
    out = result.stdout
    assert "--- PASS: TestParamServerPushPullRoundTrip" in out, out
    assert "--- PASS: TestCoordinatorListAndSubmit" in out, out
    assert "--- PASS: TestCRC32CKnownValues" in out, out
