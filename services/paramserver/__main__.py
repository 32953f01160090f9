"""Run one paramserver replica: ``python -m services.paramserver --role primary --backups host:port``."""

from __future__ import annotations

import asyncio
import sys

import torch

from services.paramserver.replica import ReplicaState, Role
from services.paramserver.registration import Registration
from services.paramserver.replicator import Replicator
from services.paramserver.servicer import ParamServer
from services.paramserver.settings import ParamServerSettings
from stalwart import codec, log
from stalwart.api import paramserver_grpc
from stalwart.channel import ChannelConfig, open_channel
from stalwart.server import ConfigError, ServiceRunner, settings_or_exit

SERVICE_NAME = "stalwart.v1.ParamServerService"


def build(settings: ParamServerSettings) -> ParamServer:
    replica = ReplicaState(Role(settings.role), settings.epoch)
    if replica.role is Role.PRIMARY:
        replica.configure(Role.PRIMARY, settings.epoch, settings.backup_list())
    channel_config = ChannelConfig.from_settings(settings)
    token = settings.node_token.get_secret_value() or None
    stubs: dict[str, paramserver_grpc.ParamServerServiceStub] = {}

    def stub_for(address: str) -> paramserver_grpc.ParamServerServiceStub:
        if address not in stubs:
            stubs[address] = paramserver_grpc.ParamServerServiceStub(
                open_channel(address, channel_config, token)
            )
        return stubs[address]

    limits = codec.Limits(
        max_tensor_elements=settings.max_tensor_elements, max_stream_bytes=settings.max_stream_bytes
    )
    return ParamServer(
        replica=replica,
        replicator=Replicator(replica, stub_for, settings.min_insync, settings.chunk_bytes),
        node_id=settings.node_id,
        shard=settings.shard,
        limits=limits,
        chunk_bytes=settings.chunk_bytes,
        sync_wait_s=settings.sync_wait_seconds,
    )


async def run(settings: ParamServerSettings) -> None:
    servicer = build(settings)
    runner = ServiceRunner(
        settings,
        lambda server: paramserver_grpc.add_ParamServerServiceServicer_to_server(servicer, server),
        [SERVICE_NAME],
    )

    def on_role_change(role: Role) -> None:
        # A fenced replica serves nothing: health says so, so probes and
        # load balancers stop sending it work.
        asyncio.ensure_future(runner.set_serving(role is not Role.FENCED, SERVICE_NAME))

    servicer.on_role_change = on_role_change
    await runner.start()
    resync = asyncio.create_task(servicer.resync_forever())
    registration = Registration(settings, runner.address) if settings.coordinator else None
    if registration is not None:
        registration.start()
    try:
        await runner.wait()
    finally:
        resync.cancel()
        if registration is not None:
            await registration.stop()


def main(argv: list[str] | None = None) -> None:
    settings = settings_or_exit(ParamServerSettings, argv)
    log.configure_logging(settings.log_level, "paramserver", settings.node_id)
    torch.set_num_threads(settings.torch_threads)
    try:
        asyncio.run(run(settings))
    except ConfigError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
