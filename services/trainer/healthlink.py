"""Streams this trainer's telemetry to the health service (``--health host:port``).

One client-streaming StreamTelemetry call carries a sample every interval; when
it breaks (the health service restarted, say) a new one is opened after a pause.
Telemetry is advisory: nothing in training waits for it, and a health service
that is down only costs log lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping

import grpc
import structlog
from google.protobuf.timestamp_pb2 import Timestamp

from stalwart.api import coordinator, health, health_grpc
from stalwart.channel import cancelled_by_caller

log = structlog.get_logger(__name__)

WRITE_TIMEOUT_S = 5.0  # a write that cannot go out this fast means the link is stuck
RECONNECT_S = 1.0


class HealthLink:
    def __init__(
        self,
        channel_factory: Callable[[], grpc.aio.Channel],
        node_id: Callable[[], str],
        sample: Callable[[], Mapping[str, float]],
        step: Callable[[], int],
        interval_s: float = 0.2,
    ):
        self.channel_factory = channel_factory
        self.node_id = node_id
        self.sample = sample
        self.step = step
        self.interval_s = interval_s
        self.sent = 0
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _request(self) -> health.StreamTelemetryRequest:
        now = Timestamp()
        now.FromNanoseconds(time.time_ns())
        sample = coordinator.TelemetrySample(
            node_id=self.node_id(), step=self.step(), time=now, metrics=dict(self.sample())
        )
        return health.StreamTelemetryRequest(sample=sample)

    async def _run(self) -> None:
        while True:
            channel = self.channel_factory()
            try:
                call = health_grpc.HealthMonitorServiceStub(channel).StreamTelemetry()
                while True:
                    await asyncio.wait_for(call.write(self._request()), WRITE_TIMEOUT_S)
                    self.sent += 1
                    await asyncio.sleep(self.interval_s)
            # InvalidStateError: a write on a call the server already ended (it
            # answered, or stopped); the task ended there, and telemetry with it
            except (grpc.RpcError, grpc.aio.UsageError, asyncio.InvalidStateError,
                    TimeoutError) as err:  # fmt: skip
                log.warning("telemetry stream to the health service broke", error=str(err))
            except asyncio.CancelledError:
                if cancelled_by_caller():
                    raise  # stop()
                # grpc.aio cancels a client-streaming call by itself when a write
                # fails because the server ended the stream: the call died, not us
                log.warning("telemetry stream to the health service was cancelled by grpc")
            except Exception:  # noqa: BLE001 - reading a sample failed: telemetry goes on
                log.exception("telemetry sample failed")
            finally:
                with contextlib.suppress(Exception):
                    await channel.close()
            await asyncio.sleep(RECONNECT_S)
