"""A trainer's telemetry link opens a new stream whenever the health service ends one.

A server that ends the call (a health service stopping, or answering early) made the
link's next write raise InvalidStateError, which ended the link's task: the trainer
sent no telemetry again until it restarted. A real gRPC server here ends every
stream after its first sample.
"""

from __future__ import annotations

import asyncio

import grpc

from services.trainer.healthlink import HealthLink
from stalwart.api import health, health_grpc
from tests.helpers import assert_eventually_async


class _EndsEachStream(health_grpc.HealthMonitorServiceServicer):
    def __init__(self) -> None:
        self.streams = 0

    async def StreamTelemetry(self, request_iterator, context):
        self.streams += 1
        async for _ in request_iterator:
            return health.StreamTelemetryResponse()  # one sample, then the call ends
        return health.StreamTelemetryResponse()


async def _link_until(servicer, sample, enough) -> None:
    """Run a HealthLink (sampling with ``sample``) against a real server of
    ``servicer`` until ``enough()`` holds."""
    server = grpc.aio.server()
    health_grpc.add_HealthMonitorServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    link = HealthLink(
        lambda: grpc.aio.insecure_channel(f"127.0.0.1:{port}"),
        lambda: "trainer-x", sample, lambda: 0, interval_s=0.01,
    )  # fmt: skip
    link.start()
    try:
        await assert_eventually_async(enough, timeout=30)
    finally:
        await link.stop()
        await server.stop(None)


async def _streams_after_ends() -> int:
    servicer = _EndsEachStream()
    await _link_until(servicer, lambda: {"cpu": 1.0}, lambda: _at_least(servicer, 3))
    return servicer.streams


async def _at_least(servicer: _EndsEachStream, n: int) -> bool:
    return servicer.streams >= n


def test_a_stream_the_server_ended_is_opened_again() -> None:
    assert asyncio.run(_streams_after_ends()) >= 3


class _Counts(health_grpc.HealthMonitorServiceServicer):
    def __init__(self) -> None:
        self.samples = 0

    async def StreamTelemetry(self, request_iterator, context):
        async for _ in request_iterator:
            self.samples += 1
        return health.StreamTelemetryResponse()


async def _samples_after_a_failed_reading() -> int:
    servicer = _Counts()
    readings = iter([RuntimeError("NVML: the driver went away")])

    def sample() -> dict[str, float]:
        failure = next(readings, None)
        if failure is not None:
            raise failure
        return {"cpu": 1.0}

    await _link_until(servicer, sample, lambda: _sampled(servicer, 3))
    return servicer.samples


async def _sampled(servicer: _Counts, n: int) -> bool:
    return servicer.samples >= n


def test_a_sample_that_failed_to_read_does_not_end_telemetry() -> None:
    assert asyncio.run(_samples_after_a_failed_reading()) >= 3
