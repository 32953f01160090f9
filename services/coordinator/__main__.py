"""Run one coordinator replica: ``python -m services.coordinator --store-url shm:///dev/shm/stalwart/x``.

Start two or more on the same store: one leads (store lease), the rest are
hot standbys that answer NOT_LEADER with the leader's address and take over
when the lease lapses. SIGTERM hands the lease over before exiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

import structlog

from services.coordinator import metrics, retention
from services.coordinator.checkpoints import Checkpoints
from services.coordinator.control import Control
from services.coordinator.election import Election
from services.coordinator.healthwatch import HealthWatch
from services.coordinator.leader import LeaderState, holder_string
from services.coordinator.nodeprobe import NodeProbe
from services.coordinator.paramwatch import ParamWatch, ReplicaLinks
from services.coordinator.sdcguard import SdcGuard
from services.coordinator.servicer import CoordinatorServicer
from services.coordinator.settings import CoordinatorSettings
from services.coordinator.shardpieces import ShardPieces
from services.coordinator.statestore import StateStore
from stalwart import log
from stalwart.api import coordinator_grpc
from stalwart.channel import ChannelConfig, open_channel
from stalwart.errors import StalwartError
from stalwart.server import ConfigError, ServiceRunner, run_process, settings_or_exit
from stalwart.stores import open_store

SERVICE_NAME = "stalwart.v1.CoordinatorService"
logger = structlog.get_logger("services.coordinator")


async def _every(period: float, fn) -> None:
    """Call ``fn`` every ``period`` seconds while leading; errors are logged, never fatal."""
    while True:
        try:
            await fn()
        except StalwartError as exc:
            if exc.kind.reason != "NOT_LEADER":
                logger.warning("control loop step failed", error=str(exc))
        except Exception:
            logger.exception("control loop step failed")
        await asyncio.sleep(period)


async def run(settings: CoordinatorSettings) -> None:
    try:
        store = await asyncio.to_thread(open_store, settings.store_url)
    except StalwartError as exc:
        raise ConfigError(f"cannot open the store: {exc}") from exc
    state = StateStore(store, settings.store_prefix, settings.request_retention_seconds)
    leader = LeaderState(settings.leader_ttl_seconds, settings.leader_margin_seconds)
    control = Control(settings, state, leader)
    token = settings.node_token.get_secret_value() or None
    # Polls and probes go without transparent retries: a killed process must fail them
    # at once (connection refused), so it is declared dead before its lease runs out;
    # every round decides afresh anyway. Checkpoint calls keep the retrying channels.
    channels = ChannelConfig.from_settings(settings)
    probe = dataclasses.replace(channels, retry_unavailable=False)
    links = ReplicaLinks(lambda a: open_channel(a, probe, token))
    watch = ParamWatch(
        control,
        links,
        settings.paramserver_unreachable_polls,
        settings.paramserver_backups,
        settings.hung_step_seconds,
    )
    model_retention = retention.ModelRetention(control, links, settings.keep_finished_models)
    node_probe = NodeProbe(control, links.channel, settings.heartbeat_interval_seconds)
    checkpoint_links = ReplicaLinks(lambda a: open_channel(a, channels, token))
    checkpoints = Checkpoints(control, checkpoint_links.stub, watch.group, settings)
    control.checkpoints = checkpoints
    health_watch = None
    if settings.health:
        health_watch = HealthWatch(
            control,
            open_channel(settings.health, ChannelConfig.from_settings(settings), token),
            settings.health_drain_risk,
            settings.health_poll_seconds,
        )
    control.sdc = SdcGuard(
        control,
        settings.duplicate_check_timeout_seconds,
        health_watch.raise_alert if health_watch is not None else None,
    )

    holder = {"election": None}
    runner = ServiceRunner(
        settings,
        lambda server: coordinator_grpc.add_CoordinatorServiceServicer_to_server(
            CoordinatorServicer(
                control, holder["election"], settings, ShardPieces(checkpoint_links.stub)
            ),
            server,
        ),
        [SERVICE_NAME],
        on_shutdown=lambda: _hand_over(holder["election"]),
        services_ready_at_start=False,  # ready (for probes, balancers) only while leading
    )

    async def lead(epoch: int) -> None:
        await control.take_over(epoch)
        await runner.set_serving(True, SERVICE_NAME)

    def follow() -> None:
        control.stand_down()
        asyncio.ensure_future(runner.set_serving(False, SERVICE_NAME))

    # The election needs the bound address, the servicer needs the election:
    # build the election first with the address filled in after binding.
    leases = (
        await _open_leases(settings.lease_url, state.lease_name) if settings.lease_url else None
    )
    election = Election(state, leader, "", settings, lead, follow, leases=leases)
    metrics.watch(control)
    holder["election"] = election
    control.on_fenced = election.fenced
    await runner.start()
    election.holder = holder_string(settings.node_id, settings.advertise_address or runner.address)
    tasks = [
        asyncio.create_task(election.run()),
        asyncio.create_task(_every(settings.tick_seconds, control.tick)),
        asyncio.create_task(_every(settings.paramserver_poll_seconds, watch.round)),
        asyncio.create_task(_every(retention.PERIOD_S, model_retention.round)),
        asyncio.create_task(_every(retention.PERIOD_S, retention.JobRetention(control).round)),
        asyncio.create_task(_every(settings.tick_seconds, node_probe.round)),
        asyncio.create_task(_every(settings.tick_seconds, checkpoints.round)),
    ]
    if health_watch is not None:
        tasks.append(asyncio.create_task(health_watch.run()))
    try:
        await runner.wait()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(links.close(), checkpoint_links.close())
        await asyncio.to_thread(checkpoints.close)
        store.close()


async def _open_leases(url: str, lease_name: str):
    """The leader lease's own backend: a Kubernetes Lease for ``k8s://``, else a store.

    On Kubernetes the store prefix is part of the Lease object's name: one that
    makes no valid name is refused here, not by every election round after."""
    try:
        if url.startswith("k8s://"):
            from stalwart.stores import k8s_lease  # the client itself only in from_url

            k8s_lease.object_name(k8s_lease.parse_k8s_url(url)[1], lease_name)
            return await asyncio.to_thread(k8s_lease.K8sLeases.from_url, url)
        return await asyncio.to_thread(open_store, url)
    except Exception as exc:  # also the kubernetes client's own config errors
        raise ConfigError(f"cannot open the lease backend {url}: {exc}") from exc


async def _hand_over(election: Election | None) -> None:
    """On SIGTERM a leader releases its lease so a standby takes over at once; a
    replica acquires nothing from then on, and gives back a lease that an acquire
    already in flight still gets."""
    if election is not None:
        with contextlib.suppress(Exception):
            await election.stop()


def main(argv: list[str] | None = None) -> None:
    settings = settings_or_exit(CoordinatorSettings, argv)
    log.configure_logging(settings.log_level, "coordinator", settings.node_id)
    run_process(run, settings)


if __name__ == "__main__":
    main()
