"""Run one paramserver replica: ``python -m services.paramserver --role primary --backups host:port``."""

from __future__ import annotations

import asyncio
import dataclasses
import sys

import torch

from services.paramserver import checkpointing, metrics, optim
from services.paramserver.faults import Faults
from services.paramserver.registration import Registration
from services.paramserver.replica import ReplicaState, Role
from services.paramserver.replicator import Replicator
from services.paramserver.servicer import ParamServer, add_to_server
from services.paramserver.settings import ParamServerSettings
from stalwart import codec, heap, log
from stalwart.api import common
from stalwart.channel import ChannelConfig, open_channel
from stalwart.client.paramserver import ParamServerStub
from stalwart.server import ServiceRunner, run_process, settings_or_exit

SERVICE_NAME = "stalwart.v1.ParamServerService"
BACKUP_RECONNECT_S = 1.0


def build(settings: ParamServerSettings) -> ParamServer:
    replica = ReplicaState(Role(settings.role), settings.epoch)
    if replica.role is Role.PRIMARY:
        replica.configure(Role.PRIMARY, settings.epoch, settings.backup_list())
    # Links to backups reconnect within a second: with gRPC's default backoff
    # (up to 120 s) a backup restarted after an outage waited that long to be
    # caught up, and with min_insync >= 1 every push was refused meanwhile. And
    # no transparent retries: with them a forward to a killed backup took 0.7 s
    # to fail, and the step waited for it; the resync loop catches a backup up.
    channel_config = dataclasses.replace(
        ChannelConfig.from_settings(settings),
        max_reconnect_backoff_s=BACKUP_RECONNECT_S,
        retry_unavailable=False,
    )
    token = settings.node_token.get_secret_value() or None
    stubs: dict[str, ParamServerStub] = {}

    def stub_for(address: str) -> ParamServerStub:
        if address not in stubs:
            stubs[address] = ParamServerStub(open_channel(address, channel_config, token))
        return stubs[address]

    limits = codec.Limits(
        max_tensor_elements=settings.max_tensor_elements, max_stream_bytes=settings.max_stream_bytes
    )
    return ParamServer(
        replica=replica,
        replicator=Replicator(
            replica,
            stub_for,
            settings.min_insync,
            settings.chunk_bytes,
            settings.backup_ack_seconds,
            use_streams=not settings.unary_replication,
        ),
        node_id=settings.node_id,
        shard=settings.shard,
        limits=limits,
        chunk_bytes=settings.chunk_bytes,
        sync_wait_s=settings.sync_wait_seconds,
        faults=Faults.parse(settings.faults),
        memory_budget=settings.memory_budget_bytes,
    )


async def run(settings: ParamServerSettings) -> None:
    servicer = build(settings)
    runner = ServiceRunner(
        settings,
        lambda server: add_to_server(servicer, server),
        [SERVICE_NAME],
        servicer.close_streams,
        services_ready_at_start=False,  # set from the replica's role once serving
    )

    def on_role_change(role: Role) -> None:
        # Ready only as primary: a backup takes no client calls and a fenced replica
        # serves nothing, so readiness probes and balancers send them no work. The
        # process itself stays alive (the "" name), and a backup still replicates.
        asyncio.ensure_future(runner.set_serving(role is Role.PRIMARY, SERVICE_NAME))

    servicer.on_role_change = on_role_change
    metrics.watch(servicer)
    await runner.start()
    on_role_change(servicer.replica.role)
    resync = asyncio.create_task(servicer.resync_forever())
    registration = (
        Registration(settings, settings.advertise_address or runner.address)
        if settings.coordinator
        else None
    )
    if registration is not None:
        servicer.committed_step = registration.committed_step
        registration.start()
    try:
        await runner.wait()
    finally:
        resync.cancel()
        if registration is not None:
            await registration.stop()
        # stopped: let a checkpoint upload still running finish before the process ends
        await asyncio.to_thread(checkpointing.finish_uploads)


def _warm_up() -> None:
    """Build and step each optimizer once on a throwaway tensor, before serving.

    torch imports ``torch._dynamo`` when a process builds its first optimizer,
    which takes seconds (5-10 s on a busy two-core machine). Paid here, before
    the ready file and health say SERVING, it no longer stalls the first
    RegisterModel or the InstallState that catches up a restarted backup.
    """
    for kind in (
        common.OPTIMIZER_KIND_SGD,
        common.OPTIMIZER_KIND_ADAM,
        common.OPTIMIZER_KIND_ADAMW,
    ):
        param = torch.zeros(1, requires_grad=True)
        optimizer = optim.build(common.OptimizerSpec(kind=kind, lr=0.1), [param])
        param.grad = torch.ones(1)
        optimizer.step()


def main(argv: list[str] | None = None) -> None:
    settings = settings_or_exit(ParamServerSettings, argv)
    log.configure_logging(settings.log_level, "paramserver", settings.node_id)
    try:
        faults = Faults.parse(settings.faults)
    except ValueError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        sys.exit(2)
    if faults.active:
        log.get_logger(__name__).warning("TEST FAULT INJECTION IS ON", faults=settings.faults)
    torch.set_num_threads(settings.torch_threads)
    heap.keep_freed_memory()  # a push's buffers are reused, not faulted in again
    _warm_up()
    run_process(run, settings)


if __name__ == "__main__":
    main()
