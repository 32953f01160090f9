"""Every service described and called by reflection alone, as a user without our .proto files would.

Starts one process of each service (coordinator, paramserver, trainer, health)
and, with grpcurl, lists each server's services, describes every method and its
request and response messages (their files come with every dependency), and
calls a method; ghz load-tests a method it resolved by reflection. grpcurl and
ghz come from `make api-tools` (.tools/go/bin); without them the test skips,
unless STALWART_REQUIRE_BACKENDS=1.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2

import stalwart.api  # noqa: F401  (loads the files our servers serve into the default pool)
from stalwart.procs import ServiceProcess, start_service
from tests.helpers import PRELOAD

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / ".tools" / "go" / "bin"
GRPCURL, GHZ = TOOLS / "grpcurl", TOOLS / "ghz"
HEALTH = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
REFLECTION = "grpc.reflection.v1alpha.ServerReflection"
SERVES = {
    "coordinator": "stalwart.v1.CoordinatorService",
    "paramserver": "stalwart.v1.ParamServerService",
    "trainer": "stalwart.v1.TrainerService",
    "health": "stalwart.v1.HealthMonitorService",
}

if not (GRPCURL.exists() and GHZ.exists()):
    if os.environ.get("STALWART_REQUIRE_BACKENDS") == "1":
        raise RuntimeError(
            "grpcurl/ghz missing and STALWART_REQUIRE_BACKENDS=1: run make api-tools"
        )
    pytestmark = pytest.mark.skip(reason="grpcurl/ghz not installed (make api-tools)")


def grpcurl(*args: str) -> str:
    cmd = [str(GRPCURL), "-plaintext", "-max-time", "60", *args]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, f"{' '.join(cmd)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def servers(run_dir: Path) -> Iterator[dict[str, ServiceProcess]]:
    store = f"shm://{run_dir / 'reflection-store'}"
    started: dict[str, ServiceProcess] = {}
    try:
        started["coordinator"] = start_service(
            "services.coordinator",
            ["--store-url", store],
            run_dir,
            "refl-coord",
            cwd=ROOT,
            preload=PRELOAD,
        )
        join = ["--coordinator", started["coordinator"].address]
        for role, args in (
            ("paramserver", ["--role", "primary", *join]),
            ("trainer", join),
            ("health", []),
        ):
            started[role] = start_service(f"services.{role}", args, run_dir, f"refl-{role}",
                                          cwd=ROOT, preload=PRELOAD)  # fmt: skip
        yield started
    finally:
        for proc in started.values():
            proc.terminate(timeout=10)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("role", sorted(SERVES))
def test_every_method_and_message_described_by_reflection(servers, role):
    address = servers[role].address
    listed = set(grpcurl(address, "list").split())
    assert listed == {SERVES[role], HEALTH, REFLECTION}
    pool = descriptor_pool.Default()
    for service in (SERVES[role], HEALTH):
        methods = grpcurl(address, "list", service).split()
        want = pool.FindServiceByName(service).methods
        assert sorted(methods) == sorted(m.full_name for m in want)
        for method in want:
            described = grpcurl(address, "describe", method.full_name)
            assert f"{method.full_name} is a method" in described, described
            for message in {method.input_type.full_name, method.output_type.full_name}:
                text = grpcurl(address, "describe", message)
                assert f"{message} is a message" in text, text


@pytest.mark.timeout(300)
def test_calls_by_reflection_alone(servers):
    coord = servers["coordinator"].address
    status = json.loads(grpcurl(coord, "stalwart.v1.CoordinatorService/GetClusterStatus"))
    assert status["is_leader"] is True and status["epoch"]
    check = json.loads(grpcurl("-d", "{}", servers["health"].address, f"{HEALTH}/Check"))
    assert check["status"] == "SERVING"
    # A nested message from another file (common.proto) resolves through the dependencies.
    text = grpcurl(coord, "describe", "stalwart.v1.ShardPiece")
    assert "row_start" in text


@pytest.mark.timeout(300)
def test_ghz_drives_a_method_found_by_reflection(servers):
    cmd = [
        str(GHZ), "--insecure", "--format", "json", "-n", "40", "-c", "2", "--timeout", "30s",
        "--call", "stalwart.v1.CoordinatorService.GetClusterStatus", "-d", "{}",
        servers["coordinator"].address,
    ]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=240, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["statusCodeDistribution"] == {"OK": 40}, report.get("errorDistribution")
