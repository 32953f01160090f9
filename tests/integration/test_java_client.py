"""The Java client against a live local cluster: the wire contract from the JVM.

Builds clients/java (build.sh: protoc and protoc-gen-grpc-java from Maven Central,
the libraries resolved by Maven, javac), then runs its live check
(`dev.stalwart.client.Smoke`): list jobs through whichever coordinator leads, a bad
spec refused INVALID_ARGUMENT with the ErrorInfo reason read from the status
details, a job submitted with the optional fields left to the coordinator's
defaults (twice with one request id: one job), followed to the end, and its final
weights pulled with every chunk's CRC32C checked. They must equal, bitwise, what
the Python client pulls. Skips when Java or Maven is not installed, unless
STALWART_REQUIRE_BACKENDS=1.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest

from stalwart.api import coordinator
from tests.integration.clients_live import (
    assert_same_weights,
    finished_job,
    live_cluster,
    missing_tools,
    run_in,
)

JAVA_DIR = Path(__file__).resolve().parents[2] / "clients" / "java"
_run = partial(run_in, JAVA_DIR)

if skip_reason := missing_tools("java", "javac", "mvn"):
    pytestmark = pytest.mark.skip(reason=skip_reason)


@pytest.fixture(scope="module")
def classpath() -> str:
    _run(["bash", "build.sh"], timeout=900)
    return (JAVA_DIR / "target" / "classpath").read_text().strip()


@pytest.mark.timeout(1200)
def test_java_client_against_live_services(classpath: str, run_dir: Path) -> None:
    with live_cluster(run_dir, "java-client") as cluster:
        addresses = cluster.coordinator_addresses
        dump = run_dir / "java-client-weights.json"
        result = _run(
            ["java", "-cp", classpath, "dev.stalwart.client.Smoke"], timeout=900,
            # the standby first, when the first replica leads: NOT_LEADER must be followed
            STALWART_COORDINATOR=",".join(reversed(addresses)), STALWART_WEIGHTS_OUT=str(dump),
        )  # fmt: skip
        passed = [line for line in result.stdout.splitlines() if line.startswith("PASS ")]
        assert len(passed) == 6, result.stdout
        assert "FAIL" not in result.stdout
        job_id = assert_same_weights(dump, addresses)
        job = finished_job(addresses, job_id)
        assert job.state == coordinator.JOB_STATE_SUCCEEDED and job.step == 5
