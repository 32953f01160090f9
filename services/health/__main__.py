"""Run the health service: ``python -m services.health [--coordinator host:port]``.

Ingests telemetry (StreamTelemetry), scores every node online and raises alerts
that the coordinator watches (WatchAlerts). The offline evaluation of the
detectors is ``python -m services.health.eval``.
"""

from __future__ import annotations

from services.health.servicer import HealthServicer
from services.health.settings import HealthSettings
from stalwart import log
from stalwart.api import common, health_grpc
from stalwart.channel import ChannelConfig
from stalwart.client.coordinator import CoordinatorClient, NodeSession
from stalwart.server import ServiceRunner, run_process, settings_or_exit

SERVICE_NAME = "stalwart.v1.HealthMonitorService"


async def run(settings: HealthSettings) -> None:
    servicer = HealthServicer(settings)
    runner = ServiceRunner(
        settings,
        lambda server: health_grpc.add_HealthMonitorServiceServicer_to_server(servicer, server),
        [SERVICE_NAME],
    )
    await runner.start()
    session = None
    if settings.coordinator:
        client = CoordinatorClient(
            settings.coordinator_list(),
            settings.node_token.get_secret_value() or None,
            channel_config=ChannelConfig.from_settings(settings),
        )
        session = NodeSession(client, common.NODE_ROLE_HEALTH,
                              settings.advertise_address or runner.address,
                              node_id=settings.node_id)  # fmt: skip
        await session.start()
    try:
        await runner.wait()
    finally:
        if session is not None:
            await session.stop()
            await session.client.close()


def main(argv: list[str] | None = None) -> None:
    settings = settings_or_exit(HealthSettings, argv)
    log.configure_logging(settings.log_level, "health", settings.node_id)
    run_process(run, settings)


if __name__ == "__main__":
    main()
