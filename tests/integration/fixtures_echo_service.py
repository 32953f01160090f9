"""A tiny service on the real bootstrap, for the bootstrap's own integration tests.

TrainerService:       GetTrainerStatus answers canned data; StopTrainer raises a
                      StalwartError (FENCED, with metadata).
HealthMonitorService: WatchAlerts streams two alerts then fails (NOT_LEADER);
                      ListAlerts hits a bug (INTERNAL); StreamTelemetry counts samples.
Run: python -m tests.integration.fixtures_echo_service --port 0 --ready-file r.json
"""

from __future__ import annotations

import grpc

from stalwart import api, log
from stalwart.errors import ErrorKind, StalwartError
from stalwart.server import rpc_handler, run_service, settings_or_exit
from stalwart.settings import ServiceSettings


class EchoSettings(ServiceSettings):
    """Settings of the test service: the shared ones plus one of its own."""

    job_id: str = "job-echo"
    """Job the canned trainer status reports."""


class Trainer(api.trainer_grpc.TrainerServiceServicer):
    def __init__(self, settings: EchoSettings) -> None:
        self._settings = settings

    @rpc_handler
    async def GetTrainerStatus(self, request, context):
        log.bind(job=self._settings.job_id)
        return api.trainer.GetTrainerStatusResponse(
            node_id=self._settings.node_id, job_id=self._settings.job_id, slot=3, device="cpu"
        )

    @rpc_handler
    async def StopTrainer(self, request, context):
        raise StalwartError(ErrorKind.FENCED, "replica is fenced", epoch=7)


class Monitor(api.health_grpc.HealthMonitorServiceServicer):
    @rpc_handler
    async def WatchAlerts(self, request, context):
        for index in range(2):
            yield api.health.WatchAlertsResponse()
            log.get_logger("echo").info("alert sent", index=index)
        raise StalwartError(ErrorKind.NOT_LEADER, "moved", leader="127.0.0.1:1")

    @rpc_handler
    async def ListAlerts(self, request, context):
        raise ZeroDivisionError("a bug")

    @rpc_handler
    async def StreamTelemetry(self, request_iterator, context):
        count = 0
        async for _ in request_iterator:
            count += 1
        return api.health.StreamTelemetryResponse(samples_accepted=count)


def register(settings: EchoSettings):
    def add(server: grpc.aio.Server) -> None:
        api.trainer_grpc.add_TrainerServiceServicer_to_server(Trainer(settings), server)
        api.health_grpc.add_HealthMonitorServiceServicer_to_server(Monitor(), server)

    return add


async def on_shutdown() -> None:
    log.get_logger("echo").info("shutdown hook ran")


def main() -> None:
    settings = settings_or_exit(EchoSettings)
    names = ["stalwart.v1.TrainerService", "stalwart.v1.HealthMonitorService"]
    run_service(settings, register(settings), names, on_shutdown, service="echo")


if __name__ == "__main__":
    main()
