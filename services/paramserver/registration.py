"""Optional membership of a paramserver replica in a coordinator group (``--coordinator``).

The replica registers as a PARAMSERVER of its shard and heartbeats in the
background through the client SDK's NodeSession; the coordinator polls its
GetReplicaStatus and promotes or configures it. Without ``--coordinator`` the
replica runs standalone, configured by its flags alone.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from services.paramserver.settings import ParamServerSettings
from stalwart.api import common
from stalwart.channel import ChannelConfig
from stalwart.client.coordinator import CoordinatorClient, NodeSession
from stalwart.errors import ErrorKind, RpcError, StalwartError

log = structlog.get_logger(__name__)

RETRY_S = 1.0  # pause between registration attempts while no coordinator answers


class Registration:
    def __init__(self, settings: ParamServerSettings, address: str) -> None:
        token = settings.node_token.get_secret_value() or None
        self.client = CoordinatorClient(
            settings.coordinator, token, channel_config=ChannelConfig.from_settings(settings)
        )
        self.session = NodeSession(
            self.client, common.NODE_ROLE_PARAMSERVER, address,
            node_id=settings.node_id, shard=settings.shard,
        )  # fmt: skip
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        """Register and heartbeat in the background; serving never waits for it."""
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            try:
                await self.session.start()
                return
            except (RpcError, TimeoutError) as err:
                log.warning("cannot register with the coordinator yet", error=str(err))
                await asyncio.sleep(RETRY_S)

    async def committed_step(self, job_id: str) -> int | None:
        """The steps the coordinator has on its books as committed for ``job_id``;
        None when it never admitted the job.

        Asked before a replica takes a model it does not hold. A job the coordinator
        never admitted is refused, so no caller can park state on the paramservers
        outside the coordinator's books; a job with committed steps is refused
        fresh weights (see ``ParamServer._check_fresh``). Asked every time: such
        registrations come once per job and primary."""
        try:
            job = await self.client.get_job(job_id)
        except RpcError as err:
            if err.kind in (ErrorKind.UNKNOWN_JOB, ErrorKind.NOT_FOUND):
                return None
            raise StalwartError(
                ErrorKind.UNAVAILABLE,
                f"cannot ask the coordinator about job {job_id}; retry: {err}",
            ) from None
        return int(job.step)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.session.stop()
        await self.client.close()
