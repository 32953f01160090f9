"""Every RPC of every service, fed generated messages: a status code, never a crash.

One local cluster (2 coordinators, a paramserver primary and backup, a trainer)
and a health service serve the calls. Each method gets messages generated from
its request descriptor (messages.py); every answer must be OK or a deliberate
status (INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION, RESOURCE_EXHAUSTED, ...):
UNKNOWN or INTERNAL is an unhandled exception in the server, UNAVAILABLE a server
that went down. A refused call must change nothing: no job or node appears, no
paramserver replica changes role or epoch. At the end every server still answers
its health check.

Generation is derandomized: a failure reproduces on every run and machine.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stalwart import cluster
from stalwart.api import (
    common,
    coordinator,
    coordinator_grpc,
    health,
    paramserver,
    paramserver_grpc,
    trainer,
)
from stalwart.errors import ErrorKind, RpcError
from stalwart.procs import start_service
from tests.helpers import PRELOAD
from tests.integration.fuzz import messages

pytestmark = pytest.mark.timeout(900)

CALL_TIMEOUT_S = 10.0
STREAM_TIMEOUT_S = 1.0  # server streams (watches) run until cancelled
EXAMPLES = 15
#: A valid call of these ends the server on purpose (its job is to stop it), or
#: reconfigures a paramserver replica on purpose (the coordinator's configuration
#: calls; the coordinator then reconfigures the group itself, so no "nothing
#: changed" check holds after one). Refusals of the latter: test_fencing.py.
NOT_FUZZED = {
    "stalwart.v1.TrainerService/StopTrainer",
    "stalwart.v1.ParamServerService/Promote",
    "stalwart.v1.ParamServerService/ConfigureReplica",
}
#: Codes a server gives on purpose; anything else is a defect.
DELIBERATE = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.DATA_LOSS,
    grpc.StatusCode.CANCELLED,
}

SERVICES: dict[str, ServiceDescriptor] = {
    "coordinator": coordinator.DESCRIPTOR.services_by_name["CoordinatorService"],
    "paramserver": paramserver.DESCRIPTOR.services_by_name["ParamServerService"],
    "trainer": trainer.DESCRIPTOR.services_by_name["TrainerService"],
    "health": health.DESCRIPTOR.services_by_name["HealthMonitorService"],
}
METHODS = [
    pytest.param(role, m, id=f"{s.name}.{m.name}")
    for role, s in SERVICES.items()
    for m in s.methods
    if f"{s.full_name}/{m.name}" not in NOT_FUZZED
]


@dataclass
class Servers:
    local: cluster.LocalCluster
    health_address: str

    def address(self, role: str) -> str:
        if role == "health":
            return self.health_address
        if role == "coordinator":
            return _leader(self.local)
        if role == "paramserver":
            return next(m.address for m in self.local.of_role("paramserver")
                        if m.started_as == "primary")  # fmt: skip
        return self.local.of_role("trainer")[0].address


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    root = Path(tmp_path_factory.mktemp("fuzz"))
    config = cluster.ClusterConfig(trainers=1, standbys=0, runs_root=root, preload_services=PRELOAD)
    local = cluster.start(config)
    monitor = None
    try:
        asyncio.run(cluster.wait_healthy(local, 120))
        monitor = start_service("services.health", ["--metrics-port", "-1"], root, "health",
                                timeout=120, preload=PRELOAD)  # fmt: skip
        yield Servers(local, monitor.address)
    finally:
        if monitor is not None:
            monitor.terminate(timeout=5)
        local.stop(timeout_s=10)


def _leader(local: cluster.LocalCluster, within_s: float = 30.0) -> str:
    """The leading coordinator's address; a StepDown the fuzzer sent may be in progress."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        for address in local.coordinator_addresses:
            with grpc.insecure_channel(address) as channel:
                stub = coordinator_grpc.CoordinatorServiceStub(channel)
                try:
                    status = stub.GetClusterStatus(coordinator.GetClusterStatusRequest(), timeout=5)
                except grpc.RpcError:
                    continue
                if status.is_leader:
                    return address
        time.sleep(0.1)
    raise AssertionError(f"no coordinator led within {within_s:.0f}s")


def _call(channel: grpc.Channel, service: ServiceDescriptor, method: MethodDescriptor, requests):
    """One call with ``requests`` (one message, or several for a client stream)."""
    path = f"/{service.full_name}/{method.name}"
    ser, de = (lambda m: m.SerializeToString()), (lambda b: b)
    streaming_out = method.server_streaming
    timeout = STREAM_TIMEOUT_S if streaming_out else CALL_TIMEOUT_S
    if method.client_streaming:
        factory = channel.stream_stream if streaming_out else channel.stream_unary
        answer = factory(path, ser, de)(iter(requests), timeout=timeout)
    else:
        factory = channel.unary_stream if streaming_out else channel.unary_unary
        answer = factory(path, ser, de)(requests[0], timeout=timeout)
    if streaming_out:
        for _, _reply in zip(range(3), answer, strict=False):
            pass


def _state(servers: Servers) -> tuple:
    """What a refused call must not change."""
    with grpc.insecure_channel(servers.address("coordinator")) as channel:
        stub = coordinator_grpc.CoordinatorServiceStub(channel)
        jobs = stub.ListJobs(coordinator.ListJobsRequest(page_size=1000), timeout=10).jobs
        nodes = stub.ListNodes(coordinator.ListNodesRequest(page_size=1000), timeout=10).nodes
    replicas = []
    for m in servers.local.of_role("paramserver"):
        with grpc.insecure_channel(m.address) as channel:
            stub = paramserver_grpc.ParamServerServiceStub(channel)
            status = stub.GetReplicaStatus(paramserver.GetReplicaStatusRequest(), timeout=10)
            replicas.append((m.name, status.role, status.epoch))
    return {j.job_id for j in jobs}, {n.node_id for n in nodes}, tuple(replicas)


def _alive(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=10
            )
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize(("role", "method"), METHODS)
def test_generated_requests_get_a_status_and_refusals_change_nothing(
    servers: Servers, role: str, method: MethodDescriptor
) -> None:
    service = SERVICES[role]
    one = messages.message(method.input_type)
    requests = one.map(lambda m: [m]) if not method.client_streaming else _streams(one)

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(requests)
    def check(batch) -> None:
        before = _state(servers)
        with grpc.insecure_channel(servers.address(role), options=_CHANNEL) as channel:
            code, detail = grpc.StatusCode.OK, ""
            try:
                _call(channel, service, method, batch)
            except grpc.RpcError as err:
                code, detail = err.code(), err.details()
        if code is grpc.StatusCode.DEADLINE_EXCEEDED and method.server_streaming:
            return  # a watch that had nothing more to say
        assert code in DELIBERATE, f"{method.full_name}: {code.name}: {detail}"
        if code is not grpc.StatusCode.OK:
            after = _state(servers)
            assert after[0] <= before[0], f"{method.full_name} refused, yet a job appeared"
            assert after[1] <= before[1], f"{method.full_name} refused, yet a node appeared"
            assert after[2] == before[2], f"{method.full_name} refused, yet a replica changed"

    check()
    assert _alive(servers.address(role)), f"{service.name} stopped serving"


def _streams(one):
    return st.lists(one, min_size=0, max_size=3)


# Big enough for the long strings the generator sends; the servers' own limits refuse them.
_CHANNEL = [
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.max_receive_message_length", 64 << 20),
]


def _refusal(address: str, method: str, request) -> RpcError:
    """The status a call to the coordinator at ``address`` was refused with."""
    with grpc.insecure_channel(address, options=_CHANNEL) as channel:
        stub = coordinator_grpc.CoordinatorServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            getattr(stub, method)(request, timeout=CALL_TIMEOUT_S)
    return RpcError.from_grpc(info.value)


_HUGE_ID = "j" * 200_000
_NESTED_TOKEN = base64.urlsafe_b64encode(b'{"a":' * 5000).decode()
_HUGE_LR = common.OptimizerSpec(kind=common.OPTIMIZER_KIND_SGD, lr=1e300)
#: Requests a generator of random messages does not reach: (method, request, reason).
HOSTILE = {
    "huge-job-id": ("GetJob", coordinator.GetJobRequest(job_id=_HUGE_ID), "UNKNOWN_JOB"),
    "huge-node-id": (
        "Heartbeat",
        coordinator.HeartbeatRequest(node_id=_HUGE_ID, epoch=1),
        "UNKNOWN_NODE",
    ),
    "nested-page-token": (
        "ListJobs",
        coordinator.ListJobsRequest(page_token=_NESTED_TOKEN),
        "INVALID_ARGUMENT",
    ),
    "num-shards-2^31": (
        "CreateJob",
        coordinator.CreateJobRequest(spec=coordinator.JobSpec(model="mlp", num_shards=2**31 - 1)),
        "LIMIT_EXCEEDED",
    ),
    "lr-1e300": (
        "CreateJob",
        coordinator.CreateJobRequest(spec=coordinator.JobSpec(model="mlp", optimizer=_HUGE_LR)),
        "INVALID_ARGUMENT",
    ),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_requests_get_their_code_and_reason(servers, case):
    method, request, reason = HOSTILE[case]
    before = _state(servers)
    err = _refusal(servers.address("coordinator"), method, request)
    assert (err.code, err.reason) == (ErrorKind[reason].code, reason), err
    assert len(err.message) < 2000  # an echoed id is clipped, not sent whole
    assert _state(servers) == before
    assert _alive(servers.address("coordinator"))
