"""Raw wire helpers for the paramserver integration tests.

The tests talk to replicas two ways: through the client SDK
(:mod:`stalwart.client`), as trainers do, and through the generated stubs with
hand-built streams, to send exactly the bytes a case needs (a bad CRC, a cut
stream, a stale epoch).
"""

from __future__ import annotations

import asyncio
import os
import signal
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from stalwart import codec
from stalwart.api import common, paramserver, paramserver_grpc
from stalwart.channel import ChannelConfig, open_channel
from stalwart.client import ShardGroupClient
from stalwart.errors import RpcError
from stalwart.procs import ServiceProcess

SERVICE = "stalwart.v1.ParamServerService"
TIMEOUT_S = 10.0

Stub = paramserver_grpc.ParamServerServiceStub
StubFor = Callable[[str], Stub]


# --- channels -------------------------------------------------------------------------


@asynccontextmanager
async def stubs() -> AsyncIterator[StubFor]:
    """``stub_for(address)`` over channels opened in this loop and closed at the end.

    Reconnects back off for at most a second, as the primary's own links do: a
    replica restarted on its old port is reachable again at once, not after
    gRPC's default backoff of up to two minutes."""
    channels: dict[str, grpc.aio.Channel] = {}
    config = ChannelConfig(max_reconnect_backoff_s=1.0)

    def stub_for(address: str) -> Stub:
        if address not in channels:
            channels[address] = open_channel(address, config)
        return Stub(channels[address])

    try:
        yield stub_for
    finally:
        await asyncio.gather(*(c.close() for c in channels.values()))


def group_client(addresses: Sequence[str], **kw) -> ShardGroupClient:
    kw.setdefault("call_timeout_s", TIMEOUT_S)
    return ShardGroupClient(list(addresses), **kw)


# --- specs ----------------------------------------------------------------------------


# These tests compare with torch.optim fed the plain slot-order sum: SUM reduction.
_SUM = common.GRAD_REDUCTION_SUM


def sgd(lr: float, momentum: float = 0.0) -> common.OptimizerSpec:
    return common.OptimizerSpec(
        kind=common.OPTIMIZER_KIND_SGD, lr=lr, momentum=momentum, reduction=_SUM
    )


def adam(lr: float) -> common.OptimizerSpec:
    return common.OptimizerSpec(kind=common.OPTIMIZER_KIND_ADAM, lr=lr, reduction=_SUM)


def consistency(mode: str, staleness: int = 0, refuse: bool = False) -> common.ConsistencySpec:
    modes = {
        "sync": common.CONSISTENCY_MODE_SYNC,
        "async": common.CONSISTENCY_MODE_ASYNC,
        "ssp": common.CONSISTENCY_MODE_SSP,
    }
    policy = common.STALENESS_POLICY_REFUSE if refuse else common.STALENESS_POLICY_UNSPECIFIED
    return common.ConsistencySpec(mode=modes[mode], staleness=staleness, policy=policy)


def model_header(
    job_id: str,
    params: Mapping[str, torch.Tensor],
    optimizer: common.OptimizerSpec,
    mode: common.ConsistencySpec,
    num_slots: int,
    epoch: int = 1,
) -> paramserver.ModelHeader:
    return paramserver.ModelHeader(
        job_id=job_id,
        optimizer=optimizer,
        consistency=mode,
        num_slots=num_slots,
        epoch=epoch,
        tensors=[codec.spec_of(n, t) for n, t in params.items()],
    )


def one_hot(index: int, size: int = 4) -> dict[str, torch.Tensor]:
    """A gradient of one parameter ``w`` of ``size`` zeros with a 1 at ``index``: after
    SGD at lr 1 the weights say which pushes were applied, and how often."""
    grad = torch.zeros(size)
    grad[index] = 1.0
    return {"w": grad}


# --- raw calls ------------------------------------------------------------------------


async def call(coro):
    """Await a stub call; a failure comes back as :class:`RpcError` (code + reason)."""
    try:
        return await coro
    except grpc.RpcError as exc:
        raise RpcError.from_grpc(exc) from None


async def expect_error(coro, code: grpc.StatusCode, reason: str | Iterable[str]) -> RpcError:
    """Await ``coro``, which must fail with ``code`` and one of the ErrorInfo ``reason``s."""
    with pytest.raises(RpcError) as info:
        await call(coro)
    err = info.value
    reasons = {reason} if isinstance(reason, str) else set(reason)
    assert (err.code, err.reason) in {(code, r) for r in reasons}, f"got {err!r} ({err.reason})"
    return err


async def register_raw(
    stub: Stub, header: paramserver.ModelHeader, params: Mapping[str, torch.Tensor]
) -> paramserver.RegisterModelResponse:
    messages = [paramserver.RegisterModelRequest(header=header)]
    messages += [
        paramserver.RegisterModelRequest(chunk=c)
        for c in codec.encode_chunks(list(params.values()))
    ]
    return await call(stub.RegisterModel(iter(messages), timeout=TIMEOUT_S))


def push_messages(
    job_id: str,
    step: int,
    slot: int,
    grads: Mapping[str, torch.Tensor],
    base_version: int = 0,
    epoch: int = 1,
    chunk_bytes: int = codec.DEFAULT_CHUNK_BYTES,
) -> list[paramserver.PushRequest]:
    """A whole Push stream: the header, then the gradients' chunks."""
    header = paramserver.PushHeader(
        job_id=job_id,
        step=step,
        slot=slot,
        base_version=base_version,
        epoch=epoch,
        tensors=[codec.spec_of(n, g) for n, g in grads.items()],
    )
    chunks = codec.encode_chunks(list(grads.values()), chunk_bytes)
    return [paramserver.PushRequest(header=header)] + [
        paramserver.PushRequest(chunk=c) for c in chunks
    ]


def stream_messages(
    messages: Sequence[paramserver.PushRequest],
) -> list[paramserver.PushStreamRequest]:
    """The same push as PushStream messages (laid out alike)."""
    return [paramserver.PushStreamRequest.FromString(m.SerializeToString()) for m in messages]


async def push_raw(stub: Stub, messages: Sequence[paramserver.PushRequest]):
    return await call(stub.Push(iter(messages), timeout=TIMEOUT_S))


async def pull_raw(
    stub: Stub,
    job_id: str,
    since_version: int = -1,
    min_version: int = 0,
    epoch: int = 1,
    timeout: float = TIMEOUT_S,
    chunk_size: int = 0,
) -> tuple[int, dict[str, torch.Tensor]]:
    request = paramserver.PullRequest(
        job_id=job_id, since_version=since_version, min_version=min_version, epoch=epoch,
        chunk_size=chunk_size,
    )  # fmt: skip
    header, assembler = None, None
    try:
        async for message in stub.Pull(request, timeout=timeout):
            if message.WhichOneof("part") == "header":
                header = message.header
                assembler = codec.ChunkAssembler(header.tensors)
            else:
                assembler.add(message.chunk)
    except grpc.RpcError as exc:
        raise RpcError.from_grpc(exc) from None
    assert header is not None, "pull stream without a header"
    return header.version, assembler.finish()


async def status(stub: Stub) -> paramserver.GetReplicaStatusResponse:
    return await call(stub.GetReplicaStatus(paramserver.GetReplicaStatusRequest(), timeout=5))


async def fingerprint(
    stub: Stub, job_id: str, at_version: int = 0
) -> paramserver.GetFingerprintResponse:
    request = paramserver.GetFingerprintRequest(job_id=job_id, at_version=at_version)
    # wait_for_ready: a replica just restarted may still be reconnecting
    return await call(stub.GetFingerprint(request, timeout=TIMEOUT_S, wait_for_ready=True))


async def configure_backup(stub: Stub, epoch: int):
    request = paramserver.ConfigureReplicaRequest(role=common.REPLICA_ROLE_BACKUP, epoch=epoch)
    return await call(stub.ConfigureReplica(request, timeout=TIMEOUT_S))


async def promote(stub: Stub, epoch: int, backups: Sequence[str] = (), stub_for=None):
    """Promote as the coordinator does: the backups are configured at the epoch first
    (``stub_for`` reaches them), since replicas take an epoch from nothing else."""
    for address in backups:
        await configure_backup(stub_for(address), epoch)
    request = paramserver.PromoteRequest(epoch=epoch, backups=list(backups))
    return await call(stub.Promote(request, timeout=TIMEOUT_S))


async def assert_same_state(
    stub_for: StubFor, replicas: Sequence[ServiceProcess], job_id: str
) -> paramserver.GetFingerprintResponse:
    """Every replica holds bitwise the same parameters and optimizer state at the same version."""
    prints = [await fingerprint(stub_for(r.address), job_id) for r in replicas]
    first = prints[0]
    assert first.tensors, "a fingerprint lists the job's tensors"
    for other, replica in zip(prints[1:], replicas[1:], strict=True):
        assert (other.version, other.combined) == (first.version, first.combined), replica.name
        assert list(other.tensors) == list(first.tensors), replica.name
    return first


async def health_status(address: str, service: str = SERVICE) -> int:
    """grpc.health.v1 status of ``service`` (default the paramserver's) at ``address``."""
    channel = open_channel(address)
    try:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        return reply.status
    finally:
        await channel.close()


# --- processes and metrics ------------------------------------------------------------


def signal_group(proc: ServiceProcess, sig: signal.Signals) -> None:
    os.killpg(proc.pid, sig)


def scrape(proc: ServiceProcess) -> str:
    url = f"http://127.0.0.1:{proc.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()


def metric(proc: ServiceProcess, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` (0 when none)."""
    total = 0.0
    for family in text_string_to_metric_families(scrape(proc)):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                total += sample.value
    return total


def rpc_errors(proc: ServiceProcess, reason: str) -> float:
    return metric(proc, "stalwart_rpc_errors_total", reason=reason)
