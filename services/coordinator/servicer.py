"""gRPC adapter of the coordinator: checks input, calls Control, converts the answer.

No decisions here: validation, conversion, and the NOT_LEADER answer (with the
leader's address) come from the library and the control object.
"""

from __future__ import annotations

import asyncio
import time

import structlog

from services.coordinator.control import Control, Directions
from services.coordinator.convert import (
    JOB_STATES_BACK,
    NODE_STATES_BACK,
    ROLES_BACK,
    job_to_proto,
    timestamp,
)
from services.coordinator.election import Election
from services.coordinator.jobs import JobState
from services.coordinator.membership import LEASED, NodeRecord, Role
from services.coordinator.settings import CoordinatorSettings
from services.coordinator.shardpieces import ShardPieces
from services.coordinator.taskerrors import TaskError
from stalwart import jobspec, limits, paging, usererrors
from stalwart.api import common, coordinator, coordinator_grpc
from stalwart.errors import ErrorKind, StalwartError
from stalwart.server import rpc_handler
from stalwart.stores.common import check_key

log = structlog.get_logger(__name__)

WATCH_POLL_S = 1.0  # a watcher re-checks leadership at least this often
_PHASES = {
    coordinator.TASK_ERROR_PHASE_IMPORT: usererrors.IMPORT,
    coordinator.TASK_ERROR_PHASE_STEP: usererrors.STEP,
}


class CoordinatorServicer(coordinator_grpc.CoordinatorServiceServicer):
    def __init__(
        self,
        control: Control,
        election: Election,
        settings: CoordinatorSettings,
        pieces: ShardPieces | None = None,
    ) -> None:
        self.control = control
        self.election = election
        self.settings = settings
        self.pieces = pieces  # None: GetShardMap answers without pieces

    # --- jobs ----------------------------------------------------------------------

    @rpc_handler
    async def CreateJob(self, request, context):
        limits.check_string("request_id", request.request_id, limits.MAX_ID)
        # off the event loop: nothing a client sends may hold up the lease or other calls
        spec = await asyncio.to_thread(self._admissible, request)
        job = await self.control.create_job(request.job_id, spec, request.request_id)
        return coordinator.CreateJobResponse(job=job_to_proto(job))

    def _admissible(self, request):
        jobspec.validate_job_id(request.job_id)
        spec = jobspec.normalized(request.spec)
        jobspec.validate_job_spec(spec, self.settings.max_slots, self.settings.max_steps)
        return spec

    @rpc_handler
    async def GetJob(self, request, context):
        job = self.control.job(request.job_id)
        return coordinator.GetJobResponse(job=job_to_proto(job, self.control.lost_groups))

    @rpc_handler
    async def ListJobs(self, request, context):
        self.control.require_leader()
        _check_filter("state", request.state, JOB_STATES_BACK)
        wanted = JOB_STATES_BACK.get(request.state)
        items = [j for j in self.control.jobs.values() if wanted is None or j.state is wanted]
        # newest first: sort by negated creation time
        chunk, token = paging.page(items, lambda j: [-j.created_at, j.job_id],
                                   request.page_size, request.page_token)  # fmt: skip
        return coordinator.ListJobsResponse(
            jobs=[job_to_proto(j, self.control.lost_groups) for j in chunk],
            next_page_token=token,
        )

    @rpc_handler
    async def CancelJob(self, request, context):
        _check_reason(request)
        job = await self.control.once(
            f"CancelJob/{request.job_id}", request.request_id,
            lambda: self.control.cancel_job(request.job_id, request.reason),
            _job_key, self._job_named,
        )  # fmt: skip
        return coordinator.CancelJobResponse(job=job_to_proto(job))

    async def _job_named(self, key: bytes):
        return self.control.job(key.decode())

    async def _node_named(self, key: bytes):
        return self.control.node(key.decode())

    # --- membership ----------------------------------------------------------------

    @rpc_handler
    async def RegisterNode(self, request, context):
        role = ROLES_BACK.get(request.role)
        if role is None or role is Role.COORDINATOR:
            raise StalwartError(
                ErrorKind.INVALID_ARGUMENT, "role must be PARAMSERVER, TRAINER, HEALTH or AGENT"
            )
        if not request.address or len(request.address) > 200:
            raise StalwartError(
                ErrorKind.INVALID_ARGUMENT,
                "address (host:port, at most 200 characters) is required",
            )
        if not 0 <= request.shard < jobspec.MAX_SHARDS:
            # a shard of -1 passed every `shard < num_shards` test: a replica of it
            # that died was taken for every job's lost group
            raise StalwartError(
                ErrorKind.INVALID_ARGUMENT,
                f"shard must be in [0, {jobspec.MAX_SHARDS}), got {request.shard}",
            )
        node_id = request.node_id or f"{role.value}-{_short_id()}"
        check_key("node_id", node_id)
        limits.check_map("labels", request.labels)
        record = NodeRecord(node_id, role, request.address, standby=request.standby,
                            labels=dict(request.labels), shard=request.shard)  # fmt: skip
        node = await self.control.register(record)
        return coordinator.RegisterNodeResponse(
            node_id=node.node_id,
            lease_ms=int(self.settings.node_lease_seconds * 1000),
            heartbeat_interval_ms=int(self.settings.heartbeat_interval_seconds * 1000),
            epoch=self.control.epoch,
        )

    @rpc_handler
    async def Heartbeat(self, request, context):
        step_time = (
            request.telemetry.metrics.get("step_time_seconds")
            if request.HasField("telemetry")
            else None
        )
        d = await self.control.heartbeat(request.node_id, request.epoch, request.step, step_time)
        sdc = self.control.sdc
        return coordinator.HeartbeatResponse(
            directive=coordinator.DIRECTIVE_DRAIN if d.draining else coordinator.DIRECTIVE_CONTINUE,
            assignment=self._assignment(d),
            epoch=self.control.epoch,
            lease_expire_time=timestamp(d.node.lease_expires),
            gradient_checks=sdc.checks_for(request.node_id) if sdc is not None else [],
        )

    def _assignment(self, d: Directions) -> coordinator.Assignment | None:
        if d.job is None or d.draining:
            return None
        return coordinator.Assignment(
            job_id=d.job.job_id, spec=d.job.spec, slot=d.slot, step=d.job.step,
            shard_map=self._shard_map(d.job.num_shards), standby=not d.slots, slots=d.slots,
        )  # fmt: skip

    def _shard_map(self, num_shards: int) -> coordinator.GetShardMapResponse:
        members = self.control.members.nodes
        groups = []
        for shard in range(num_shards):
            primary_id, epoch = self.control.groups.get(shard, ("", 0))
            primary = members.get(primary_id)
            backups = sorted(
                n.address for n in members.values()
                if n.role is Role.PARAMSERVER and n.shard == shard and n.leased and n.node_id != primary_id
            )  # fmt: skip
            groups.append(coordinator.ShardGroup(shard=shard, primary_address=primary.address if primary else "",
                                                 backup_addresses=backups, epoch=epoch))  # fmt: skip
        return coordinator.GetShardMapResponse(
            shard_map=common.ShardMap(num_shards=num_shards), groups=groups
        )

    # --- silent data corruption (services/coordinator/sdcguard.py) ---------------------

    @rpc_handler
    async def ReportGradient(self, request, context):
        sdc = self._sdc()
        async with self.control.lock:
            self.control.require_leader()
            await self.control.check_node_epoch(request.epoch, f"node {request.node_id}")
        verdict = await sdc.report_gradient(request)
        return coordinator.ReportGradientResponse(verdict=verdict, epoch=self.control.epoch)

    @rpc_handler
    async def ReportCorruption(self, request, context):
        limits.check_string("message", request.message, limits.MAX_REASON)
        state = await self._sdc().report_corruption(request)
        return coordinator.ReportCorruptionResponse(suspect_state=state)

    @rpc_handler
    async def ReportTaskError(self, request, context):
        phase = _PHASES.get(request.phase)
        if phase is None:
            raise StalwartError(ErrorKind.INVALID_ARGUMENT, "phase must be IMPORT or STEP")
        limits.check_string("error_type", request.error_type, limits.MAX_ID)
        limits.check_string("message", request.message, limits.MAX_REASON)
        limits.check_string("location", request.location, limits.MAX_LOCATION)
        error = TaskError(request.node_id, request.slot, request.step, phase,
                          request.error_type, request.message, request.location)  # fmt: skip
        job = await self.control.task_error(request.job_id, error)
        proto = job_to_proto(job)
        return coordinator.ReportTaskErrorResponse(job_state=proto.state, reason=proto.reason)

    def _sdc(self):
        if self.control.sdc is None:
            raise StalwartError(ErrorKind.FAILED_PRECONDITION, "corruption defences are off")
        return self.control.sdc

    @rpc_handler
    async def ListNodes(self, request, context):
        self.control.require_leader()
        _check_filter("role", request.role, ROLES_BACK)
        wanted = ROLES_BACK.get(request.role)
        items = [
            n for n in self.control.members.nodes.values() if wanted is None or n.role is wanted
        ]
        chunk, token = paging.page(
            items, lambda n: [n.node_id], request.page_size, request.page_token
        )
        holdings = self.control.holdings()
        return coordinator.ListNodesResponse(
            nodes=[self.control.node_proto(n, holdings) for n in chunk], next_page_token=token
        )

    @rpc_handler
    async def DrainNode(self, request, context):
        _check_reason(request)
        node = await self.control.once(
            f"DrainNode/{request.node_id}", request.request_id,
            lambda: self.control.drain_node(request.node_id, request.reason),
            lambda n: n.node_id.encode(), self._node_named,
        )  # fmt: skip
        return coordinator.DrainNodeResponse(node=self.control.node_proto(node))

    @rpc_handler
    async def UndrainNode(self, request, context):
        node = await self.control.once(
            f"UndrainNode/{request.node_id}", request.request_id,
            lambda: self.control.undrain_node(request.node_id, request.release_quarantine),
            lambda n: n.node_id.encode(), self._node_named,
        )  # fmt: skip
        return coordinator.UndrainNodeResponse(node=self.control.node_proto(node))

    @rpc_handler
    async def GetShardMap(self, request, context):
        answer = self._shard_map(self.control.job(request.job_id).num_shards)
        if self.pieces is not None:  # heartbeats' maps go without: trainers compute their own
            primaries = {g.shard: g.primary_address for g in answer.groups}
            answer.shard_map.pieces.extend(await self.pieces.pieces(request.job_id, primaries))
        return answer

    # --- the coordinator group -----------------------------------------------------

    @rpc_handler
    async def GetClusterStatus(self, request, context):
        """Answered by every replica (standbys too), so a CLI can show the whole group."""
        leading = self.control.epoch > 0 and self.control.leader.acting(time.monotonic())
        if leading:
            alive = sum(1 for n in self.control.members.nodes.values() if n.leased)
            running = sum(1 for j in self.control.live_jobs.values() if j.state is JobState.RUNNING)
        else:
            alive, running = await self._counts_from_store()
        leader = self.control.leader
        return coordinator.GetClusterStatusResponse(
            leader_id=leader.leader_id, leader_address=leader.leader_address, epoch=leader.epoch,
            store_url=self.control.state.store.url, nodes_alive=alive, jobs_running=running,
            is_leader=leading,
        )  # fmt: skip

    async def _counts_from_store(self) -> tuple[int, int]:
        nodes, jobs = await asyncio.gather(self.control.io(self.control.state.nodes),
                                           self.control.io(self.control.state.jobs))  # fmt: skip
        # the leader's rule (NodeRecord.leased: every node still heartbeating, drained
        # and quarantined ones too), so the count does not change with who answers
        alive = sum(1 for n in nodes if NODE_STATES_BACK.get(n.state) in LEASED)
        return alive, sum(1 for j in jobs if j.state == coordinator.JOB_STATE_RUNNING)

    @rpc_handler
    async def StepDown(self, request, context):
        self.control.require_leader()
        limits.check_string("request_id", request.request_id, limits.MAX_ID)
        key = f"StepDown:{request.request_id}"
        if request.request_id:
            # a retry (on this replica or the next leader) of a StepDown that already
            # happened gets its answer and deposes nobody; the answer is stored
            # first, since a leader that stepped down can write nothing more
            stored = await self.control.io(self.control.state.answer, key)
            if stored is not None:
                return coordinator.StepDownResponse(epoch=int(stored))
            await self.control.remember(key, str(self.control.epoch).encode())
        epoch = await self.election.step_down("StepDown requested", hold_off=True)
        return coordinator.StepDownResponse(epoch=epoch)

    @rpc_handler
    async def WatchEvents(self, request, context):
        self.control.require_leader()
        queue = self.control.events.subscribe()  # before the replay: nothing falls between
        try:
            last = request.after_sequence
            for event in await self.control.io(self.control.state.events, last):
                if _matches(event, request.job_id):
                    yield coordinator.WatchEventsResponse(event=event)
                last = event.sequence
            async for event in _live(queue, self.control):
                if event.sequence > last and _matches(event, request.job_id):
                    yield coordinator.WatchEventsResponse(event=event)
        finally:
            self.control.events.unsubscribe(queue)

    # --- checkpoints: the catalog is the checkpoint store's manifests ----------------

    @property
    def checkpoints(self):
        return self.control.checkpoints

    @rpc_handler
    async def ListCheckpoints(self, request, context):
        self.control.job(request.job_id)
        manifests = await self.checkpoints.list(request.job_id)
        chunk, token = paging.page(manifests, lambda m: [-m.step, m.checkpoint_id],
                                   request.page_size, request.page_token)  # fmt: skip
        return coordinator.ListCheckpointsResponse(checkpoints=chunk, next_page_token=token)

    @rpc_handler
    async def GetCheckpoint(self, request, context):
        self.control.require_leader()
        manifest = await self.checkpoints.find(request.checkpoint_id)
        return coordinator.GetCheckpointResponse(checkpoint=manifest)

    @rpc_handler
    async def VerifyCheckpoint(self, request, context):
        self.control.require_leader()
        manifest = await self.checkpoints.find(request.checkpoint_id)
        report = await self.checkpoints.verify(manifest)
        if not report.ok:
            raise StalwartError(ErrorKind.CHECKSUM_MISMATCH, "; ".join(report.problems[:10]))
        return coordinator.VerifyCheckpointResponse(ok=True, chunks_checked=report.chunks)

    @rpc_handler
    async def CreateCheckpoint(self, request, context):
        limits.check_string("request_id", request.request_id, limits.MAX_ID)
        manifest = await self.control.once(
            f"CreateCheckpoint/{request.job_id}", request.request_id,
            lambda: self.checkpoints.create(request.job_id),
            lambda m: m.checkpoint_id.encode(), lambda b: self.checkpoints.find(b.decode()),
        )  # fmt: skip
        return coordinator.CreateCheckpointResponse(checkpoint=manifest)

    @rpc_handler
    async def RestoreCheckpoint(self, request, context):
        self.control.require_leader()
        limits.check_string("request_id", request.request_id, limits.MAX_ID)
        manifest = await self.checkpoints.find(request.checkpoint_id)
        job = await self.control.once(
            f"RestoreCheckpoint/{request.checkpoint_id}", request.request_id,
            lambda: self.checkpoints.restore(manifest.job_id, manifest.checkpoint_id,
                                             "restore requested"),
            _job_key, self._job_named,
        )  # fmt: skip
        return coordinator.RestoreCheckpointResponse(job=job_to_proto(job))

    @rpc_handler
    async def DeleteCheckpoint(self, request, context):
        self.control.require_leader()
        collected = await self.checkpoints.delete(request.checkpoint_id)
        return coordinator.DeleteCheckpointResponse(chunks_collected=collected)


def _job_key(job) -> bytes:
    return job.job_id.encode()


def _check_filter(name: str, value: int, known: dict) -> None:
    """An enum filter must be UNSPECIFIED (all) or a value this server knows."""
    if value and value not in known:
        raise StalwartError(
            ErrorKind.INVALID_ARGUMENT, f"{name} filter {value} is not a known value"
        )


def _check_reason(request) -> None:
    limits.check_string("reason", request.reason, limits.MAX_REASON)
    limits.check_string("request_id", request.request_id, limits.MAX_ID)


def _matches(event: common.Event, job_id: str) -> bool:
    return not job_id or event.job_id == job_id


async def _live(queue: asyncio.Queue, control: Control):
    """Live events until leadership ends (a None in the queue) or a deadline-free wait."""
    while True:
        try:
            event = await asyncio.wait_for(queue.get(), WATCH_POLL_S)
        except TimeoutError:
            control.require_leader()  # ends the stream with NOT_LEADER if we were deposed
            continue
        if event is None:
            control.require_leader()
            raise StalwartError(
                ErrorKind.UNAVAILABLE, "event stream fell behind: reconnect with after_sequence"
            )
        yield event


def _short_id() -> str:
    import uuid

    return uuid.uuid4().hex[:8]
