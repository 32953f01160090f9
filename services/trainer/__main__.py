"""Run one trainer: ``python -m services.trainer --coordinator host:port[,..] [--standby]``.

Test mode without a coordinator: ``--assignment-file assignment.json`` (an
Assignment in protobuf JSON); the trainer trains it to the end and exits.
"""

from __future__ import annotations

import asyncio
import os
import sys

import torch

from services.trainer.dupcheck import DupCheck
from services.trainer.faults import Faults
from services.trainer.healthlink import HealthLink
from services.trainer.servicer import TrainerServicer
from services.trainer.settings import TrainerSettings
from services.trainer.sources import CoordinatorSource, FileSource
from services.trainer.telemetry import Telemetry
from services.trainer.worker import Worker
from stalwart import devices, log, training, usererrors
from stalwart.api import coordinator, trainer_grpc
from stalwart.channel import ChannelConfig, open_channel
from stalwart.client.coordinator import CoordinatorClient
from stalwart.client.paramserver import ParamServerClient, ShardGroupClient, replica_channels
from stalwart.server import ServiceRunner, run_process, settings_or_exit

SERVICE_NAME = "stalwart.v1.TrainerService"


def pick_device(settings: TrainerSettings) -> str:
    """The device of ``settings.device`` on this machine (DeviceError when impossible)."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = devices.local_index(settings.local_index, os.environ)
    return devices.select(devices.parse(settings.device), index, count)


def client_factory(settings: TrainerSettings):
    channels = replica_channels(
        ChannelConfig.from_settings(settings), settings.node_token.get_secret_value() or None
    )

    def make(shard_map: coordinator.GetShardMapResponse) -> ParamServerClient:
        groups = []
        for group in sorted(shard_map.groups, key=lambda g: g.shard):
            addresses = list(
                dict.fromkeys(a for a in [group.primary_address, *group.backup_addresses] if a)
            )
            groups.append(
                ShardGroupClient(
                    addresses,
                    channels,
                    call_timeout_s=settings.call_timeout_seconds,
                    retry_for_s=settings.retry_seconds,
                    chunk_bytes=settings.chunk_bytes,
                )
            )
        return ParamServerClient(groups)

    return make


def make_source(settings: TrainerSettings, worker: Worker, address: str, telemetry: Telemetry):
    if settings.assignment_file is not None:
        return FileSource(worker, settings.assignment_file)

    def client(blocking: bool = False) -> CoordinatorClient:
        return CoordinatorClient(
            settings.coordinator_list(),
            settings.node_token.get_secret_value() or None,
            channel_config=ChannelConfig.from_settings(settings),
            blocking=blocking,
        )

    # heartbeats go out from a thread of their own (sources.CoordinatorSource); the
    # reports below are calls of this loop's
    reports = client()
    source = CoordinatorSource(
        worker, client(blocking=True), address, settings.node_id, settings.standby,
        telemetry.sample, reports,
    )  # fmt: skip
    _guard_data(worker, source, reports)
    _report_user_errors(worker, source, reports)
    return source


def _report_user_errors(
    worker: Worker, source: CoordinatorSource, client: CoordinatorClient
) -> None:
    """The job's own code raised on this node: tell the coordinator (it fails the job
    when the error repeats on another trainer, or at once for a model that won't import)."""
    node_id = lambda: source.session.node_id  # noqa: E731 - known once registered
    phases = {usererrors.IMPORT: coordinator.TASK_ERROR_PHASE_IMPORT,
              usererrors.STEP: coordinator.TASK_ERROR_PHASE_STEP}  # fmt: skip

    async def report_user_error(job_id: str, err: usererrors.UserCodeError) -> None:
        answer = await client.report_task_error(node_id(), job_id, err.slot, err.step,
                                                phases[err.phase], err.error_type, err.message,
                                                err.location)  # fmt: skip
        if answer.job_state == coordinator.JOB_STATE_FAILED:
            log.get_logger(__name__).error("job failed of its own error", job=job_id,
                                           reason=answer.reason)  # fmt: skip

    worker.on_user_error = report_user_error


def _guard_data(worker: Worker, source: CoordinatorSource, client: CoordinatorClient) -> None:
    """Silent-data-corruption defences that need the coordinator: duplicate compute
    (gate and verifier) and reports of what ABFT caught on this node."""
    node_id = lambda: source.session.node_id  # noqa: E731 - known once registered
    dup = DupCheck(client, node_id, worker)
    worker.gate = dup.confirm
    source.on_checks = dup.on_checks
    loop = asyncio.get_running_loop()

    def report(kind: str, job_id: str, step: int, message: str) -> None:  # the compute's thread
        coro = client.report_corruption(node_id(), node_id(), kind, job_id, step, message)
        loop.call_soon_threadsafe(lambda: asyncio.ensure_future(_quietly(coro)))

    worker.on_corruption = report


async def _quietly(coro) -> None:
    try:
        await coro
    except Exception as exc:  # advisory: the step is recomputed whatever happens here
        log.get_logger(__name__).warning("corruption report failed", error=str(exc))


async def run(settings: TrainerSettings) -> None:
    training.make_deterministic(settings.torch_threads)
    device = pick_device(settings)
    if device.startswith("cuda"):
        torch.cuda.set_device(device)  # bare "cuda" tensors and RNG forks go there too
    worker = Worker(
        device, client_factory(settings), Faults.parse(settings.faults), settings.poll_seconds
    )
    if worker.faults.active:
        log.get_logger(__name__).warning("TEST FAULT INJECTION IS ON", faults=settings.faults)
    loop_task: asyncio.Task | None = None

    async def shutdown() -> None:  # SIGTERM: finish the step, then exit
        worker.request_stop()
        if loop_task is not None:
            await asyncio.wait({loop_task})

    runner: ServiceRunner
    servicer = TrainerServicer(
        worker, lambda: settings.node_id, lambda: runner.request_stop(), settings.grace_seconds
    )
    runner = ServiceRunner(
        settings,
        lambda server: trainer_grpc.add_TrainerServiceServicer_to_server(servicer, server),
        [SERVICE_NAME],
        on_shutdown=shutdown,
    )
    await runner.start()
    telemetry = Telemetry(device, worker.stats)
    real_sample = telemetry.sample
    # test-only telemetry faults (heat_from_step) overlay the real readings
    telemetry.sample = lambda: {**real_sample(), **worker.faults.telemetry(worker.stats.step)}
    health_link = _health_link(settings, telemetry, worker)
    loop_task = servicer.loop_task = asyncio.create_task(worker.run())
    loop_task.add_done_callback(lambda _task: runner.request_stop())
    source = make_source(settings, worker, settings.advertise_address or runner.address, telemetry)
    log.get_logger(__name__).info("trainer started", device=device, standby=settings.standby)
    try:
        await source.start()
        if health_link is not None:
            health_link.start()
        await runner.wait()
    finally:
        if health_link is not None:
            await health_link.stop()
        await source.stop()
        if not loop_task.done():
            loop_task.cancel()
    if loop_task.done() and not loop_task.cancelled() and loop_task.exception() is not None:
        raise loop_task.exception()


def _health_link(settings: TrainerSettings, telemetry: Telemetry, worker: Worker):
    if not settings.health:
        return None
    config = ChannelConfig.from_settings(settings)
    token = settings.node_token.get_secret_value() or None
    return HealthLink(
        lambda: open_channel(settings.health, config, token),
        lambda: settings.node_id,
        telemetry.sample,
        lambda: worker.stats.step,
        settings.health_interval_seconds,
    )


def main(argv: list[str] | None = None) -> None:
    settings = settings_or_exit(TrainerSettings, argv)
    log.configure_logging(settings.log_level, "trainer", settings.node_id)
    try:
        Faults.parse(settings.faults)
        pick_device(settings)  # an impossible --device fails here (no CUDA context yet)
    except ValueError as exc:  # DeviceError too
        print(f"Error: {exc}", file=sys.stderr)
        sys.exit(2)
    run_process(run, settings)


if __name__ == "__main__":
    main()
