"""Coordinator client: finds the leader among the replicas and follows it through failover.

    async with CoordinatorClient(["127.0.0.1:7000", "127.0.0.1:7001"]) as c:
        job = await c.create_job(spec)
        async for event in c.watch_events(job_id=job.job_id):
            ...

Every call goes to the replica believed to lead. ``FAILED_PRECONDITION
[NOT_LEADER]`` switches to the address in its ``leader`` metadata (or to the
next replica when that is empty) and retries; ``UNAVAILABLE`` and
``DEADLINE_EXCEEDED`` are retried against the next replica. Retries stop after
``retry_for_s``, and every attempt has ``call_timeout_s`` (heartbeats have the
shorter ``heartbeat_timeout_s``: a beat into a paused leader must reach the
next replica well within the failure detector's window). Mutating calls carry
a request id made once per call, so a retry is recognised by the server.
Failures are raised as :class:`stalwart.errors.RpcError`.

:class:`NodeSession` is the node side: register, then heartbeat in a task.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import grpc
import structlog
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_exponential

from stalwart.api import common, coordinator, coordinator_grpc
from stalwart.channel import ChannelConfig, cancelled_by_caller, open_channel, open_sync_channel
from stalwart.errors import ErrorKind, RpcError

log = structlog.get_logger(__name__)

# A job in one of these states has ended for good (JobState in the protos).
FINISHED = frozenset({
    coordinator.JOB_STATE_SUCCEEDED,
    coordinator.JOB_STATE_FAILED,
    coordinator.JOB_STATE_CANCELLED,
})  # fmt: skip
RECONNECT_BACKOFF_S = 1.0
# How often an event stream asks its replica whether it still leads, and how long
# it waits for the answer. A leader that hangs (stopped, not dead) keeps its streams
# open and silent while its successor commits events; asking is how they move on.
WATCH_CHECK_S = 1.0
WATCH_CHECK_TIMEOUT_S = 2.0

# Errors after which the same call may go to another replica.
_FOLLOW = {ErrorKind.NOT_LEADER, ErrorKind.UNAVAILABLE, ErrorKind.DEADLINE_EXCEEDED}


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, RpcError) and exc.kind in _FOLLOW


def leaders_epoch(held: int, err: RpcError) -> int | None:
    """The epoch to hold instead of ``held`` after ``err``, or None to keep ``held``.

    Only an ``UNKNOWN_EPOCH`` answer lowers a node's epoch: the coordinator leader sends
    it after reading the store and finding that no epoch above its own ever took over
    (``held`` was never issued there: the store was wiped or replaced while the node
    lived on), and it names its own epoch in the ``epoch`` metadata. Anything else, an
    epoch missing or not below ``held``, keeps what is held (docs/control-plane.md,
    "An epoch in a node's request is compared, never adopted")."""
    if err.kind is not ErrorKind.UNKNOWN_EPOCH:
        return None
    try:
        leader = int(err.metadata.get("epoch", ""))
    except ValueError:
        return None
    return leader if 0 < leader < held else None


def _split(addresses: str | Sequence[str]) -> list[str]:
    if isinstance(addresses, str):
        addresses = addresses.split(",")
    out = [a.strip() for a in addresses if a.strip()]
    if not out:
        raise ValueError("CoordinatorClient needs at least one address")
    return out


class CoordinatorClient:
    """Typed, leader-following client of ``stalwart.v1.CoordinatorService`` (asyncio)."""

    def __init__(
        self,
        addresses: str | Sequence[str],
        token: str | None = None,
        *,
        channel_config: ChannelConfig | None = None,
        call_timeout_s: float = 5.0,
        retry_for_s: float = 15.0,
        heartbeat_timeout_s: float = 0.5,
        blocking: bool = False,
        on_retry: Callable[[RpcError], None] | None = None,
    ) -> None:
        """``addresses``: the replicas, as a list or "host:port,host:port"; ``token``: bearer token.

        ``on_retry``: called with the error before each wait to retry a call (the CLI
        says, on a terminal, that it is still trying to reach a leader).

        ``blocking``: unary calls go out on blocking gRPC channels and hold the event
        loop until answered (``watch_events`` is not for such a client); only for a loop
        with nothing else to do, such as a :class:`NodeSession` on a thread of its own
        (:mod:`stalwart.client.sessionthread`).
        """
        self.addresses = _split(addresses)
        self.blocking = blocking
        self.token = token
        # Replicas come back at the same address (a restarted pod, a stand-in on the
        # same port). With gRPC's default reconnect backoff (growing to 120 s) a
        # channel to a replica that was down hides the new one for that long, and a
        # leader elected there finds every node silent and declares them all dead.
        config = channel_config or ChannelConfig()
        if config.max_reconnect_backoff_s is None:
            config = dataclasses.replace(config, max_reconnect_backoff_s=RECONNECT_BACKOFF_S)
        # No transparent gRPC retries: this client retries UNAVAILABLE itself, on the
        # next replica. With them a call to a killed leader was tried up to four times
        # there (backoffs up to 0.7 s) before it could move on, and a heartbeat used up
        # its whole deadline on the dead replica.
        config = dataclasses.replace(config, retry_unavailable=False)
        self.channel_config = config
        self.call_timeout_s = call_timeout_s
        self.retry_for_s = retry_for_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.on_retry = on_retry
        self.leader: str = self.addresses[0]
        self.epoch = 0  # highest coordinator epoch seen in a response
        self._channels: dict[str, grpc.aio.Channel | grpc.Channel] = {}
        # A stub builds one callable per method (~0.1 ms): one per address, not per call.
        self._stubs: dict[str, coordinator_grpc.CoordinatorServiceStub] = {}

    async def __aenter__(self) -> CoordinatorClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        channels = list(self._channels.values())
        self._channels.clear()
        self._stubs.clear()
        if self.blocking:
            for channel in channels:
                channel.close()
            return
        await asyncio.gather(*(c.close() for c in channels), return_exceptions=True)

    def stub(self, address: str) -> coordinator_grpc.CoordinatorServiceStub:
        if address not in self._stubs:
            opener = open_sync_channel if self.blocking else open_channel
            channel = opener(address, self.channel_config, self.token)
            self._channels[address] = channel
            self._stubs[address] = coordinator_grpc.CoordinatorServiceStub(channel)
        return self._stubs[address]

    # --- following the leader ------------------------------------------------------

    def _next_address(self, tried: str, err: RpcError) -> None:
        """Move on from ``tried`` after ``err``: to the leader it names, else the next replica."""
        if self.leader != tried:
            # Another call on this client has already moved on. Moving again from
            # here would send the two calls ping-ponging between the replicas.
            return
        hint = err.metadata.get("leader", "") if err.kind is ErrorKind.NOT_LEADER else ""
        if hint and hint != tried:
            self.leader = hint
            return
        known = self.addresses + [tried] if tried not in self.addresses else self.addresses
        self.leader = known[(known.index(tried) + 1) % len(known)]

    async def _call(self, method: str, request: Any, timeout_s: float | None = None) -> Any:
        async for attempt in AsyncRetrying(
            retry=retry_if_exception(_retryable),
            stop=stop_after_delay(self.retry_for_s),
            wait=wait_exponential(multiplier=0.02, max=0.5),
            before_sleep=self._before_retry,
            reraise=True,
        ):
            with attempt:
                return await self._once(self.leader, method, request, timeout_s)
        raise AssertionError("unreachable")  # pragma: no cover

    def _before_retry(self, state) -> None:
        if self.on_retry is not None and state.outcome is not None:
            self.on_retry(state.outcome.exception())

    async def _once(
        self, address: str, method: str, request: Any, timeout_s: float | None = None
    ) -> Any:
        try:
            response = getattr(self.stub(address), method)(
                request, timeout=timeout_s or self.call_timeout_s
            )
            if not self.blocking:
                response = await response
        except grpc.RpcError as exc:
            err = RpcError.from_grpc(exc)
            if err.kind in _FOLLOW:
                self._next_address(address, err)
            adopted = leaders_epoch(self.epoch, err)
            if adopted is not None:  # the leader never issued ours: take its own
                self.epoch = adopted
            raise err from None
        self.epoch = max(self.epoch, getattr(response, "epoch", 0) or 0)
        return response

    # --- jobs ----------------------------------------------------------------------

    async def create_job(
        self, spec: coordinator.JobSpec, job_id: str = "", request_id: str | None = None
    ) -> coordinator.Job:
        """Admit a job; retrying with the same ``request_id`` returns the same job.

        Raises RpcError INVALID_ARGUMENT (bad spec), ALREADY_EXISTS (job id taken),
        RESOURCE_EXHAUSTED (over the limits)."""
        request = coordinator.CreateJobRequest(
            job_id=job_id, spec=spec, request_id=request_id or uuid.uuid4().hex
        )
        return (await self._call("CreateJob", request)).job

    async def get_job(self, job_id: str) -> coordinator.Job:
        """One job; RpcError NOT_FOUND if there is none."""
        return (await self._call("GetJob", coordinator.GetJobRequest(job_id=job_id))).job

    async def list_jobs(
        self,
        page_size: int = 0,
        page_token: str = "",
        state: int = coordinator.JOB_STATE_UNSPECIFIED,
    ) -> coordinator.ListJobsResponse:
        """One page of jobs, newest first; ``state`` filters (a JOB_STATE_* value)."""
        request = coordinator.ListJobsRequest(
            page_size=page_size, page_token=page_token, state=state
        )
        return await self._call("ListJobs", request)

    async def all_jobs(
        self, state: int = coordinator.JOB_STATE_UNSPECIFIED
    ) -> list[coordinator.Job]:
        """Every job, newest first, page after page."""
        return await _all_pages(lambda token: self.list_jobs(0, token, state), "jobs")

    async def cancel_job(
        self, job_id: str, reason: str = "", request_id: str | None = None
    ) -> coordinator.Job:
        """Cancel a job (a finished job is returned unchanged)."""
        request = coordinator.CancelJobRequest(
            job_id=job_id, reason=reason, request_id=request_id or uuid.uuid4().hex
        )
        return (await self._call("CancelJob", request)).job

    # --- nodes ---------------------------------------------------------------------

    async def register_node(
        self,
        role: int,
        address: str,
        *,
        node_id: str = "",
        standby: bool = False,
        labels: Mapping[str, str] | None = None,
        shard: int = 0,
    ) -> coordinator.RegisterNodeResponse:
        """Register a process (``role``: a common.NODE_ROLE_* value) and get its lease."""
        request = coordinator.RegisterNodeRequest(
            role=role, address=address, node_id=node_id, standby=standby,
            labels=dict(labels or {}), shard=shard,
        )  # fmt: skip
        return await self._call("RegisterNode", request)

    async def heartbeat(
        self,
        node_id: str,
        epoch: int,
        step: int = -1,
        telemetry: coordinator.TelemetrySample | None = None,
    ) -> coordinator.HeartbeatResponse:
        """Renew a lease; RpcError NOT_FOUND [UNKNOWN_NODE] means: register again."""
        request = coordinator.HeartbeatRequest(node_id=node_id, epoch=epoch, step=step)
        if telemetry is not None:
            request.telemetry.CopyFrom(telemetry)
        return await self._call("Heartbeat", request, self.heartbeat_timeout_s)

    async def list_nodes(
        self, page_size: int = 0, page_token: str = "", role: int = common.NODE_ROLE_UNSPECIFIED
    ) -> coordinator.ListNodesResponse:
        """One page of nodes by node id; ``role`` filters (a NODE_ROLE_* value)."""
        request = coordinator.ListNodesRequest(
            page_size=page_size, page_token=page_token, role=role
        )
        return await self._call("ListNodes", request)

    async def all_nodes(self, role: int = common.NODE_ROLE_UNSPECIFIED) -> list[coordinator.Node]:
        """Every node, page after page."""
        return await _all_pages(lambda token: self.list_nodes(0, token, role), "nodes")

    async def drain_node(
        self, node_id: str, reason: str = "", request_id: str | None = None
    ) -> coordinator.Node:
        """Move a node's work to others, then give it no more; RpcError NOT_FOUND."""
        request = coordinator.DrainNodeRequest(
            node_id=node_id, reason=reason, request_id=request_id or uuid.uuid4().hex
        )
        return (await self._call("DrainNode", request)).node

    async def undrain_node(
        self, node_id: str, request_id: str | None = None, release_quarantine: bool = False
    ) -> coordinator.Node:
        """Return a draining or drained node to service (a quarantined one too with
        ``release_quarantine``); RpcError NOT_FOUND or FAILED_PRECONDITION (dead, or
        quarantined without ``release_quarantine``)."""
        request = coordinator.UndrainNodeRequest(
            node_id=node_id, request_id=request_id or uuid.uuid4().hex,
            release_quarantine=release_quarantine,
        )  # fmt: skip
        return (await self._call("UndrainNode", request)).node

    async def report_gradient(
        self, node_id: str, job_id: str, step: int, slot: int, crc: int, duplicate: bool = False
    ) -> int:
        """Report a slot batch's gradient fingerprint; returns a GRADIENT_VERDICT_* value."""
        request = coordinator.ReportGradientRequest(
            node_id=node_id, epoch=self.epoch, job_id=job_id, step=step, slot=slot,
            gradient_crc32c=crc, duplicate=duplicate,
        )  # fmt: skip
        return (await self._call("ReportGradient", request)).verdict

    async def report_corruption(
        self, node_id: str, suspect: str, kind: str, job_id: str = "", step: int = 0,
        message: str = "",
    ) -> int:  # fmt: skip
        """Report corrupt numbers caught on a node; returns the suspect's NODE_STATE_* value."""
        request = coordinator.ReportCorruptionRequest(
            node_id=node_id, suspect_node_id=suspect, job_id=job_id, step=step, message=message,
            corruption_kind=coordinator.CorruptionKind.Value(f"CORRUPTION_KIND_{kind.upper()}"),
        )  # fmt: skip
        return (await self._call("ReportCorruption", request)).suspect_state

    async def report_task_error(
        self, node_id: str, job_id: str, slot: int, step: int, phase: int, error_type: str,
        message: str, location: str = "",
    ) -> coordinator.ReportTaskErrorResponse:  # fmt: skip
        """Report that the job's own code raised (``phase``: a TASK_ERROR_PHASE_* value);
        the answer says whether the job failed of it. Repeating a report is harmless:
        only distinct trainers, or the third report of one, change anything."""
        request = coordinator.ReportTaskErrorRequest(
            node_id=node_id, job_id=job_id, slot=slot, step=step, phase=phase,
            error_type=error_type, message=message, location=location,
        )  # fmt: skip
        return await self._call("ReportTaskError", request)

    async def get_shard_map(self, job_id: str) -> coordinator.GetShardMapResponse:
        """A job's shard groups: primary, backups and epoch of each."""
        return await self._call("GetShardMap", coordinator.GetShardMapRequest(job_id=job_id))

    # --- the coordinator group -----------------------------------------------------

    async def cluster_status(self) -> coordinator.GetClusterStatusResponse:
        """The leader's view: leader, epoch, store, counts."""
        return await self._call("GetClusterStatus", coordinator.GetClusterStatusRequest())

    async def replica_status(self, address: str) -> coordinator.GetClusterStatusResponse:
        """What one replica says of itself (``is_leader``) and of the leader; no following."""
        try:
            return await self.stub(address).GetClusterStatus(
                coordinator.GetClusterStatusRequest(), timeout=self.call_timeout_s
            )
        except grpc.RpcError as exc:
            raise RpcError.from_grpc(exc) from None

    async def step_down(self, request_id: str | None = None) -> int:
        """Ask the leader to give up its lease; returns the epoch it held."""
        request = coordinator.StepDownRequest(request_id=request_id or uuid.uuid4().hex)
        return (await self._call("StepDown", request)).epoch

    async def watch_events(
        self, job_id: str = "", after_sequence: int = 0
    ) -> AsyncIterator[common.Event]:
        """Events after ``after_sequence``, then live ones, forever.

        Follows the leader: when a stream ends (leader change, fell behind) it
        reconnects and resumes after the last event it yielded. Ends only when
        no replica answers for ``retry_for_s``."""
        last = after_sequence
        while True:
            try:
                async for event in self._stream_once(job_id, last):
                    last = event.sequence
                    yield event
            except RpcError as err:
                if not _retryable(err):
                    raise
            await self._await_leader()

    async def _stream_once(self, job_id: str, after: int) -> AsyncIterator[common.Event]:
        request = coordinator.WatchEventsRequest(job_id=job_id, after_sequence=after)
        # A stream has no overall deadline: it lives as long as the watcher wants.
        # The long timeout only satisfies the channel's rule that every call has one.
        address = self.leader
        call = self.stub(address).WatchEvents(request, timeout=365 * 24 * 3600.0)
        checks = asyncio.ensure_future(self._while_leading(address, call))
        try:
            async for response in call:
                yield response.event
        except grpc.RpcError as exc:
            err = RpcError.from_grpc(exc)
            if err.kind in _FOLLOW:
                self._next_address(address, err)
            raise err from None
        except asyncio.CancelledError:
            if not checks.done() or checks.cancelled() or cancelled_by_caller():
                raise
            raise checks.result() from None  # the checks ended the stream: follow on
        finally:
            checks.cancel()
            call.cancel()

    async def _while_leading(self, address: str, call) -> RpcError:
        """Ask ``address`` every WATCH_CHECK_S whether it still leads; when it does not,
        or does not answer, end ``call`` and return why (a retryable error)."""
        while True:
            await asyncio.sleep(WATCH_CHECK_S)
            request = coordinator.GetClusterStatusRequest()
            try:
                status = await self._once(address, "GetClusterStatus", request,
                                          WATCH_CHECK_TIMEOUT_S)  # fmt: skip
            except RpcError as err:
                if err.kind not in _FOLLOW:
                    return err  # cannot tell (not allowed to ask?): the stream goes on
                why = RpcError(err.code, f"{address} stopped answering: {err.message}")
                break
            if not status.is_leader:
                why = RpcError(grpc.StatusCode.UNAVAILABLE, f"{address} no longer leads")
                break
        call.cancel()
        return why

    async def _await_leader(self) -> None:
        """Block (up to retry_for_s) until some replica answers as leader."""
        async for attempt in AsyncRetrying(
            stop=stop_after_delay(self.retry_for_s),
            wait=wait_exponential(multiplier=0.02, max=0.5),
            before_sleep=self._before_retry,
            reraise=True,
        ):
            with attempt:
                address = self.leader
                status = await self._once(
                    address, "GetClusterStatus", coordinator.GetClusterStatusRequest()
                )
                if not status.is_leader:
                    err = RpcError(grpc.StatusCode.UNAVAILABLE, "no leader yet")
                    if status.leader_address and self.leader == address:
                        self.leader = status.leader_address
                    else:
                        self._next_address(address, err)
                    raise err

    # --- checkpoints ---------------------------------------------------------------

    async def list_checkpoints(self, job_id: str, page_size: int = 0, page_token: str = ""):
        """One page of a job's complete checkpoints, newest first."""
        request = coordinator.ListCheckpointsRequest(
            job_id=job_id, page_size=page_size, page_token=page_token
        )
        return await self._call("ListCheckpoints", request)

    async def get_checkpoint(self, checkpoint_id: str) -> common.CheckpointManifest:
        return (
            await self._call(
                "GetCheckpoint", coordinator.GetCheckpointRequest(checkpoint_id=checkpoint_id)
            )
        ).checkpoint

    async def create_checkpoint(
        self, job_id: str, request_id: str | None = None
    ) -> common.CheckpointManifest:
        request = coordinator.CreateCheckpointRequest(
            job_id=job_id, request_id=request_id or uuid.uuid4().hex
        )
        return (await self._call("CreateCheckpoint", request)).checkpoint

    async def verify_checkpoint(self, checkpoint_id: str) -> coordinator.VerifyCheckpointResponse:
        """Read and check every chunk; RpcError DATA_LOSS when one is missing or corrupt."""
        return await self._call(
            "VerifyCheckpoint", coordinator.VerifyCheckpointRequest(checkpoint_id=checkpoint_id)
        )

    async def restore_checkpoint(
        self, checkpoint_id: str, request_id: str | None = None, timeout_s: float | None = None
    ) -> coordinator.Job:
        """``timeout_s``: per attempt (a restore loads the checkpoint before it answers)."""
        request = coordinator.RestoreCheckpointRequest(
            checkpoint_id=checkpoint_id, request_id=request_id or uuid.uuid4().hex
        )
        return (await self._call("RestoreCheckpoint", request, timeout_s)).job

    async def delete_checkpoint(self, checkpoint_id: str) -> int:
        """Delete a checkpoint; returns how many unreferenced chunks were collected."""
        request = coordinator.DeleteCheckpointRequest(checkpoint_id=checkpoint_id)
        return (await self._call("DeleteCheckpoint", request)).chunks_collected


async def _all_pages(fetch: Callable[[str], Awaitable[Any]], field: str) -> list[Any]:
    out, token = [], ""
    for _ in range(100_000):  # a bound, not a limit anyone reaches
        page = await fetch(token)
        out.extend(getattr(page, field))
        token = page.next_page_token
        if not token:
            break
    return out


# --- the node side ---------------------------------------------------------------------

OnUpdate = Callable[[coordinator.HeartbeatResponse], Awaitable[None] | None]


class NodeSession:
    """A node's membership: register, heartbeat in a task, register again when told to.

    Remembers the highest coordinator epoch it has seen and drops any response
    from a lower one (a deposed leader's directives and assignments). Trainers,
    paramservers and agents share it::

        session = NodeSession(client, common.NODE_ROLE_TRAINER, my_address, standby=True)
        await session.start()           # registered; beats until stop()
        session.step = 41               # reported with the next beat
        session.assignment              # latest accepted assignment (or None)
    """

    def __init__(
        self,
        client: CoordinatorClient,
        role: int,
        address: str,
        *,
        node_id: str = "",
        standby: bool = False,
        labels: Mapping[str, str] | None = None,
        shard: int = 0,
        on_update: OnUpdate | None = None,
        telemetry: Callable[[], Mapping[str, float]] | None = None,
        register_timeout_s: float = 30.0,
    ) -> None:
        self.client = client
        self.role = role
        self.address = address
        self.node_id = node_id
        self.standby = standby
        self.labels = dict(labels or {})
        self.shard = shard
        self.on_update = on_update
        self.telemetry = telemetry
        self.register_timeout_s = register_timeout_s
        self.epoch = 0
        self.step = -1
        self.interval_s = 0.2
        self.lease_s = 1.0
        self.directive = coordinator.DIRECTIVE_CONTINUE
        self.assignment: coordinator.Assignment | None = None
        self.dropped = 0  # responses ignored because they came from an older epoch
        self._task: asyncio.Task | None = None

    def accept(self, epoch: int) -> bool:
        """Adopt ``epoch`` if it is the highest seen; False for a lower (deposed) one."""
        if epoch < self.epoch:
            self.dropped += 1
            return False
        self.epoch = epoch
        return True

    async def register(self) -> None:
        """Register (or register again) until it succeeds or register_timeout_s passes."""
        response = await asyncio.wait_for(
            self.client.register_node(
                self.role, self.address, node_id=self.node_id, standby=self.standby,
                labels=self.labels, shard=self.shard,
            ),
            self.register_timeout_s,
        )  # fmt: skip
        self.node_id = response.node_id
        self.interval_s = response.heartbeat_interval_ms / 1000 or self.interval_s
        self.lease_s = response.lease_ms / 1000 or self.lease_s
        self.accept(response.epoch)
        log.info("registered with the coordinator", node=self.node_id, epoch=response.epoch)

    async def start(self) -> None:
        await self.register()
        self._task = asyncio.create_task(self._beat_forever())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def beat(self) -> coordinator.HeartbeatResponse | None:
        """One heartbeat; returns the response if accepted, None if dropped."""
        telemetry = None
        if self.telemetry is not None:
            telemetry = coordinator.TelemetrySample(
                node_id=self.node_id, step=self.step, metrics=dict(self.telemetry())
            )
        try:
            response = await self.client.heartbeat(self.node_id, self.epoch, self.step, telemetry)
        except RpcError as err:
            adopted = leaders_epoch(self.epoch, err)
            if adopted is not None:
                # The leader never issued the epoch held (the store was wiped or replaced
                # while this node lived on): go on at the leader's. The next beat carries
                # it, and registers again if that leader does not know this node.
                log.warning("coordinator epoch unknown to the leader; taking the leader's",
                            node=self.node_id, held=self.epoch, leader=adopted)  # fmt: skip
                self.epoch = adopted
                self.assignment = None  # given under an epoch the leader does not know
                return None
            if err.kind is not ErrorKind.UNKNOWN_NODE:
                raise
            log.warning("lease lapsed; registering again", node=self.node_id)
            self.assignment = None
            await self.register()
            return None
        if not self.accept(response.epoch):
            return None
        self.directive = response.directive
        self.assignment = response.assignment if response.HasField("assignment") else None
        if self.on_update is not None:
            result = self.on_update(response)
            if asyncio.iscoroutine(result):
                await result
        return response

    async def _beat_forever(self) -> None:
        while True:
            try:
                await self.beat()
            except (RpcError, TimeoutError) as err:
                # The client already retried across replicas; keep beating.
                log.warning("heartbeat failed", node=self.node_id, error=str(err))
            await asyncio.sleep(self.interval_s)
