"""The Go client against a real paramserver: the wire contract is language-neutral.

Builds clients/go (generate.sh: protoc-gen-go and protoc-gen-go-grpc from the Go
module proxy, driven by grpc_tools.protoc), starts a local cluster (two
coordinators, a paramserver group, a trainer) and a lone paramserver for the raw
round trip, and runs `go test ./...` with STALWART_PARAMSERVER and
STALWART_COORDINATOR pointing at them, under
STALWART_REQUIRE_BACKENDS=1 so no Go test may skip. One Go test runs a job to
the end and writes its final weights; they must equal the Python client's pull,
bitwise. Skips when no Go toolchain is installed, unless
STALWART_REQUIRE_BACKENDS=1.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest

from tests.integration.clients_live import (
    assert_same_weights,
    live_cluster,
    missing_tools,
    run_in,
    standalone_paramserver,
)

GO_DIR = Path(__file__).resolve().parents[2] / "clients" / "go"
# the module's go.sum is completed as needed, not read-only
_run = partial(run_in, GO_DIR, GOFLAGS="-mod=mod")

if skip_reason := missing_tools("go"):
    pytestmark = pytest.mark.skip(reason=skip_reason)


@pytest.fixture(scope="module")
def go_client() -> Path:
    _run(["bash", "generate.sh"], timeout=600)
    _run(["go", "build", "./..."], timeout=600)
    return GO_DIR


@pytest.mark.timeout(1200)
def test_go_client_against_live_services(go_client: Path, run_dir: Path) -> None:
    with (
        live_cluster(run_dir, "go-client") as cluster,
        standalone_paramserver(run_dir, "go-client-ps") as lone_paramserver,
    ):
        coordinators = cluster.coordinator_addresses
        dump = run_dir / "go-client-weights.json"
        result = _run(
            ["go", "test", "-count=1", "-v", "./..."], timeout=900,
            STALWART_PARAMSERVER=lone_paramserver,
            STALWART_COORDINATOR=",".join(coordinators),
            STALWART_WEIGHTS_OUT=str(dump),
            STALWART_REQUIRE_BACKENDS="1",
        )  # fmt: skip
        out = result.stdout
        assert "--- PASS: TestParamServerPushPullRoundTrip" in out, out
        assert "--- PASS: TestCoordinatorListAndSubmit" in out, out
        assert "--- PASS: TestCRC32CKnownValues" in out, out
        assert "--- PASS: TestSubmitFollowPull" in out, out
        # the Go client's pull of the final weights equals the Python client's, bitwise
        assert_same_weights(dump, coordinators)
