"""A real health service refuses node ids past --max-nodes (RESOURCE_EXHAUSTED, with
the flag named), keeps serving the nodes it tracks, and reports nothing for the one
it refused."""

from __future__ import annotations

import grpc
import pytest

from stalwart.api import coordinator, health, health_grpc
from stalwart.procs import start_service
from tests.helpers import PRELOAD


@pytest.fixture
def monitor(tmp_path):
    proc = start_service(
        "services.health",
        ["--metrics-port", "-1", "--max-nodes", "2", "--forget-after-seconds", "3600"],
        tmp_path,
        "health",
        timeout=120,
        preload=PRELOAD,
    )
    yield proc
    proc.terminate(timeout=5)


def _stream(stub, node: str) -> health.StreamTelemetryResponse:
    sample = coordinator.TelemetrySample(node_id=node, step=1, metrics={"loss": 1.0})
    return stub.StreamTelemetry(iter([health.StreamTelemetryRequest(sample=sample)]), timeout=30)


def test_a_node_past_the_limit_is_refused_and_the_others_kept(monitor) -> None:
    with grpc.insecure_channel(monitor.address) as channel:
        stub = health_grpc.HealthMonitorServiceStub(channel)
        assert _stream(stub, "node-a").samples_accepted == 1
        assert _stream(stub, "node-b").samples_accepted == 1
        with pytest.raises(grpc.RpcError) as refused:
            _stream(stub, "node-c")
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max-nodes" in refused.value.details()
        assert _stream(stub, "node-a").samples_accepted == 1  # tracked nodes go on
        listed = stub.ListNodeRisks(health.ListNodeRisksRequest(), timeout=30)
        assert sorted(r.node_id for r in listed.risks) == ["node-a", "node-b"]
        with pytest.raises(grpc.RpcError) as unknown:
            stub.GetNodeRisk(health.GetNodeRiskRequest(node_id="node-c"), timeout=30)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
