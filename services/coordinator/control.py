"""The leader's executor: holds membership, jobs and shard groups, feeds the decision
modules events, and carries out what they decide (persist, announce, reply).

Every operation runs under one asyncio lock, checks first that this replica
may act as leader (NOT_LEADER otherwise), and ends with :meth:`_flush`, which
writes what changed to the store under the coordinator epoch and only then
publishes the events. A write refused because a newer epoch took over
(:class:`Fenced`) makes this replica step down at once.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from services.coordinator import drain, elastic, jobs, metrics, placement, taskerrors
from services.coordinator.convert import (
    job_from_proto,
    job_to_proto,
    node_from_proto,
    node_to_proto,
)
from services.coordinator.events import EventLog
from services.coordinator.leader import LeaderState
from services.coordinator.membership import Membership, NodeRecord, NodeState, Role, UnknownNode
from services.coordinator.promotion import ReplicaView
from services.coordinator.settings import CoordinatorSettings
from services.coordinator.statestore import Fenced, RequestRecord, StateStore
from stalwart import limits
from stalwart.api import common
from stalwart.errors import ErrorKind, StalwartError

log = structlog.get_logger(__name__)

EV = common  # event kinds live in common.proto


# Roles a drain would mark and change nothing for: draining is moving a trainer's work.
NOT_DRAINED = frozenset({Role.PARAMSERVER, Role.COORDINATOR, Role.HEALTH})


@dataclass
class Directions:
    """What a heartbeat answers: the node, its directive and what it holds."""

    node: NodeRecord
    draining: bool
    job: jobs.Job | None = None
    slots: tuple[int, ...] = ()  # ascending; none with a job: a warm standby place

    @property
    def slot(self) -> int:
        """The first slot held, -1 for none."""
        return self.slots[0] if self.slots else -1


class Control:
    def __init__(
        self,
        settings: CoordinatorSettings,
        state: StateStore,
        leader: LeaderState,
        on_fenced: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        self.settings = settings
        self.state = state
        self.leader = leader
        self.on_fenced = on_fenced
        self.lock = asyncio.Lock()
        self.members = Membership(settings.node_lease_seconds, settings.detector())
        self.jobs: dict[str, jobs.Job] = {}  # every job ever admitted
        # the jobs placement and the polls still look at: unfinished ones, and finished
        # ones until their nodes are released (they never hold one again). A long-lived
        # leader admits jobs without end; heartbeats and reconciles walk only these.
        self.live_jobs: dict[str, jobs.Job] = {}
        # the finished jobs' ids in the order they ended, oldest first: the first ones
        # are forgotten past --keep-finished-jobs
        self.finished_order: dict[str, None] = {}
        self.groups: dict[int, tuple[str, int]] = {}  # shard -> (primary node id, epoch)
        # shard -> (primary node id, the process instance the group relies on), stored
        # with the group so that a new leader tells a primary restarted meanwhile
        self.primary_instances: dict[int, tuple[str, str]] = {}
        self.views: dict[str, ReplicaView] = {}  # paramserver node id -> last poll
        self.lost_groups: set[int] = set()  # every replica gone; a restore is pending
        # shard -> the highest epoch this leader decided to configure there (see
        # hand_out_epoch); the group's record has it only once it is carried out
        self.epochs_handed: dict[int, int] = {}
        self.restore_generation = 0  # bumped when a restore rewinds versions
        self.checkpoints = None  # checkpoints.Checkpoints, set by the service's main
        self.sdc = None  # sdcguard.SdcGuard, set by the service's main
        self.events = EventLog()
        self.epoch = 0  # epoch this replica leads under; 0 while it does not
        self._dirty_jobs: set[str] = set()
        self._dirty_nodes: set[str] = set()
        self._forgotten_nodes: set[str] = set()  # dead long enough: deleted at the flush
        self._forgotten_jobs: set[str] = set()  # ended long enough ago: deleted at the flush
        self._dirty_groups: set[int] = set()
        self._dirty_errors: set[str] = set()  # job ids whose user-error counts changed
        # a failed flush's events, back at the head of the pending ones: how many, and
        # what the recovery clock found in them (it must not see them twice)
        self._events_fed = 0
        self._found_unwritten: list = []
        self._store_write: asyncio.Future | None = None  # the flush's write in its thread
        self._requests: dict[str, asyncio.Future] = {}  # request key -> the call in flight
        self.task_errors = taskerrors.TaskErrors()
        # the cluster's recovery counts by kind, as stored (metrics.RecoveryCounts exports
        # them while leading); replaced whole by each flush that counts one
        self.recoveries: dict[str, int] = {}
        # node id -> why its drain started, until the NODE_DRAINED event names it. Never
        # outlives the call that starts the drain (placement vacates a DRAINING node's
        # work in the same reconcile), so the stored event carries it to a new leader.
        self._drain_reasons: dict[str, str] = {}

    # --- guards and I/O ------------------------------------------------------------

    def require_leader(self) -> None:
        if self.epoch and self.leader.acting(time.monotonic()):
            return
        raise StalwartError(
            ErrorKind.NOT_LEADER,
            "this coordinator is a standby; call the leader",
            leader=self.leader.leader_address,
        )

    async def io(self, fn: Callable, *args):
        """Run a blocking store call in a thread, bounded by the store timeout."""
        try:
            return await asyncio.wait_for(
                asyncio.to_thread(fn, *args), self.settings.store_timeout_seconds
            )
        except TimeoutError:
            raise StalwartError(ErrorKind.UNAVAILABLE, "coordination store timed out") from None

    async def _flush(self) -> None:
        """Persist what changed under our epoch, then publish the events.

        A write that fails for another reason than a newer leader (the store timed out
        or refused) loses nothing: what it held stays dirty and its events pending, in
        order, for the next flush (the next call, or the tick) to write again. Records
        are written whole and events under their sequence numbers, so writing one twice
        is harmless; before, the changes were dropped, and the store kept e.g. a job
        cancelled in memory as running for the next leader."""
        epoch = self.epoch
        dirty = _Dirty(set(self._dirty_jobs), set(self._dirty_nodes), set(self._dirty_groups),
                       set(self._forgotten_nodes), set(self._forgotten_jobs))  # fmt: skip
        jobs_out = [job_to_proto(self.jobs[j]) for j in sorted(dirty.jobs) if j in self.jobs]
        nodes = self.members.nodes
        nodes_out = [self.node_proto(nodes[n]) for n in sorted(dirty.nodes) if n in nodes]
        nodes_gone = sorted(n for n in dirty.nodes_gone if n not in nodes)
        jobs_gone = sorted(j for j in dirty.jobs_gone if j not in self.jobs)
        groups_out = [
            (s, *self.groups.get(s, ("", 0)), s in self.lost_groups, self._primary_instance(s))
            for s in sorted(dirty.groups)
        ]
        errors_out = self._errors_out()
        events = self.events.take_pending()
        # the first ones came back from a failed flush: the recovery clock has seen them
        found = self._found_unwritten + metrics.outcomes(events[self._events_fed :])
        recoveries = metrics.counted(self.recoveries, found)
        self._dirty_jobs.clear(), self._dirty_nodes.clear(), self._dirty_groups.clear()
        self._forgotten_nodes.clear(), self._forgotten_jobs.clear()

        def write() -> None:
            for job in jobs_out:
                self.state.put_job(epoch, job)
            for job_id in jobs_gone:
                self.state.delete_job(epoch, job_id)
            for node_id in nodes_gone:
                self.state.delete_node(epoch, node_id)
            for node in nodes_out:
                self.state.put_node(epoch, node)
            for shard, primary, group_epoch, lost, instance in groups_out:
                self.state.put_group(epoch, shard, primary, group_epoch, lost, instance)
            for job_id, entries in errors_out:
                self.state.put_task_errors(epoch, job_id, entries)
            if recoveries != self.recoveries:  # with the events that complete them
                self.state.put_recoveries(epoch, recoveries)
            self.state.append_events(epoch, events, self.settings.events_kept)

        try:
            await self._write(write)
        except Fenced as exc:
            await self._fenced(str(exc))
            raise StalwartError(
                ErrorKind.NOT_LEADER, "deposed: a newer coordinator leads"
            ) from None
        except BaseException:  # a call cancelled mid-write too: it may not have landed
            self._keep_unwritten(dirty, [job_id for job_id, _ in errors_out], events, found)
            raise
        self._events_fed, self._found_unwritten = 0, []
        self.events.publish(events)
        self.recoveries = recoveries
        metrics.observe(found)

    async def _write(self, write: Callable[[], None]) -> None:
        """Run a flush's store write in a thread, one at a time. The store timeout gives
        up waiting, not the thread: a write that outlived it may still land, and a later
        write started beside it could land first and be overwritten by older records."""
        timeout = self.settings.store_timeout_seconds
        running = self._store_write
        if running is not None and not running.done():
            done, _ = await asyncio.wait({running}, timeout=timeout)
            if not done:
                raise StalwartError(
                    ErrorKind.UNAVAILABLE, "coordination store timed out (a write still runs)"
                )
        self._store_write = asyncio.ensure_future(asyncio.to_thread(write))
        # its error is raised to the caller below, or nobody waits for it any more
        self._store_write.add_done_callback(lambda f: f.cancelled() or f.exception())
        try:
            await asyncio.wait_for(asyncio.shield(self._store_write), timeout)
        except TimeoutError:
            raise StalwartError(ErrorKind.UNAVAILABLE, "coordination store timed out") from None

    def _keep_unwritten(self, dirty: _Dirty, errors: list[str], events: list, found: list) -> None:
        """A failed flush's changes and events, back for the next flush."""
        self._dirty_jobs |= dirty.jobs
        self._dirty_nodes |= dirty.nodes
        self._dirty_groups |= dirty.groups
        self._forgotten_nodes |= dirty.nodes_gone
        self._forgotten_jobs |= dirty.jobs_gone
        self._dirty_errors.update(errors)
        self.events.put_back(events)
        self._events_fed, self._found_unwritten = len(events), found

    def _errors_out(self) -> list[tuple[str, list]]:
        """(job id, user-error counts) to write ([] drops the key); the counts of a job
        that has finished are forgotten here."""
        for job_id in self._dirty_jobs:
            job = self.jobs.get(job_id)
            if job is not None and job.finished and self.task_errors.holds(job_id):
                self.task_errors.forget(job_id)
                self._dirty_errors.add(job_id)
        errors = [(j, self.task_errors.entries(j)) for j in sorted(self._dirty_errors)]
        self._dirty_errors.clear()
        return errors

    async def _fenced(self, reason: str) -> None:
        log.warning("fenced by a newer coordinator epoch", reason=reason)
        self.stand_down()
        if self.on_fenced is not None:
            await self.on_fenced(reason)

    # --- idempotency keys ----------------------------------------------------------

    async def once(
        self,
        method: str,
        request_id: str,
        run: Callable[[], Awaitable],
        encode: Callable[[object], bytes],
        decode: Callable[[bytes], Awaitable],
    ):
        """Run a mutating call at most once per ``request_id``.

        ``method`` names the call and what it acts on ("CancelJob/job-7"): one request
        id sent to cancel two jobs cancels both, where keying by the call alone
        answered the second with the first job, uncancelled.

        The answer's key (``encode(result)``: a job id, a checkpoint id...) is kept
        in the store, so a retry, also one that reaches the next leader, gets
        ``decode(key)`` instead of a second run; a retry arriving while the first
        call still runs waits for it. Without a request id the call just runs.
        """
        if not request_id:
            return await run()
        key = f"{method}:{request_id}"
        running = self._requests.get(key)
        if running is not None:
            return await asyncio.shield(running)
        future = self._requests[key] = asyncio.get_running_loop().create_future()
        future.add_done_callback(lambda f: f.cancelled() or f.exception())
        try:
            stored = await self.io(self.state.answer, key)
            result = await (
                decode(stored) if stored is not None else self._run_once(key, run, encode)
            )
        except asyncio.CancelledError:
            future.cancel()
            raise
        except BaseException as exc:
            future.set_exception(exc)
            raise
        finally:
            self._requests.pop(key, None)
        future.set_result(result)
        return result

    async def _run_once(self, key: str, run, encode):
        result = await run()
        await self.remember(key, encode(result))
        return result

    async def remember(self, key: str, value: bytes) -> None:
        """Store a call's answer key under our epoch (NOT_LEADER if we were deposed)."""
        try:
            await self.io(self.state.put_answer, self.epoch, key, value)
        except Fenced as exc:
            await self._fenced(str(exc))
            raise StalwartError(
                ErrorKind.NOT_LEADER, "deposed: a newer coordinator leads"
            ) from None

    # --- leadership ----------------------------------------------------------------

    async def take_over(self, epoch: int) -> None:
        """Elected: fence older epochs, reload everything, grant fresh leases, announce."""
        async with self.lock:
            await self.io(self.state.take_over, epoch)
            jobs_in, nodes_in, groups, last, errors, recoveries = await self.io(self._read_all)
            self.recoveries = recoveries  # the old leaders' count goes on
            now = time.time()
            self.jobs = {j.job_id: job_from_proto(j) for j in jobs_in}
            self.task_errors = taskerrors.TaskErrors()
            for job_id, entries in errors.items():  # the old leader's counts go on
                if job_id in self.jobs and not self.jobs[job_id].finished:
                    self.task_errors.load(job_id, entries)
            self.members = Membership(self.settings.node_lease_seconds, self.settings.detector())
            self.members.nodes = {n.node_id: node_from_proto(n) for n in nodes_in}
            self.members.refresh_all(now)  # nobody dies only because the leader changed
            self._restore_standbys(nodes_in)
            self.live_jobs = dict(self.jobs)  # the _reconcile below leaves the released out
            ended = sorted((j.updated_at, j.job_id) for j in self.jobs.values() if j.finished)
            self.finished_order = dict.fromkeys(job_id for _, job_id in ended)
            self.groups = {k: (g.primary, g.epoch) for k, g in groups.items()}
            self.lost_groups = {k for k, g in groups.items() if g.lost}
            self.epochs_handed = {}
            self.primary_instances = {k: (g.primary, g.instance)
                                      for k, g in groups.items() if g.instance}  # fmt: skip
            self.views = {}
            self.events.reset(last)
            self._events_fed, self._found_unwritten = 0, []
            self.epoch = epoch
            self.events.add(EV.EVENT_KIND_LEADER_ELECTED, f"leader elected at epoch {epoch}",
                            node_id=self.leader.leader_id, epoch=epoch)  # fmt: skip
            self._reconcile(now)
            await self._flush()
        log.info("leading", epoch=epoch, jobs=len(self.jobs), nodes=len(self.members.nodes))

    def hand_out_epoch(self, shard: int, epoch: int) -> int:
        """The epoch a promotion or restore of ``shard`` decided now (under the lock)
        configures: ``epoch`` (promotion.next_epoch's), or one above the last this
        leader handed out there. Decisions are carried out after the lock is released,
        and the group's record takes their epoch only then, so a failover and a restore
        (or a wedged primary's failover) decided meanwhile picked the same epoch for two
        different replicas: two primaries at one epoch."""
        epoch = max(epoch, self.epochs_handed.get(shard, 0) + 1)
        self.epochs_handed[shard] = epoch
        return epoch

    def _primary_instance(self, shard: int) -> str:
        """The stored instance of the shard's recorded primary; "" if not known."""
        primary_id, instance = self.primary_instances.get(shard, ("", ""))
        return instance if primary_id and primary_id == self.groups.get(shard, ("", 0))[0] else ""

    def _read_all(self):
        s = self.state
        return s.jobs(), s.nodes(), s.groups(), s.last_sequence(), s.task_errors(), s.recoveries()

    def _restore_standbys(self, nodes_in) -> None:
        for n in nodes_in:
            job = self.jobs.get(n.job_id)
            if job is not None and n.slot < 0 and n.node_id not in job.standbys:
                job.standbys.append(n.node_id)

    def stand_down(self) -> None:
        """Leadership ended: stop acting and end every watcher's stream."""
        if self.epoch:
            log.warning("no longer leading", epoch=self.epoch)
        self.epoch = 0
        self.events.close_all()

    # --- nodes ---------------------------------------------------------------------

    def holdings(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """node id -> (job id, the slots it holds ascending; none for a standby place),
        for active jobs and finished ones not yet released."""
        out: dict[str, tuple[str, tuple[int, ...]]] = {}
        for job in self.live_jobs.values():
            out.update({n: (job.job_id, ()) for n in job.standbys})
            for node_id, slots in elastic.load({s.index: s.node_id for s in job.slots}).items():
                out[node_id] = (job.job_id, tuple(slots))
        return out

    def node_proto(self, node: NodeRecord, holdings: dict | None = None):
        job_id, slots = (holdings or self.holdings()).get(node.node_id, ("", ()))
        return node_to_proto(node, job_id, slots)

    async def register(self, record: NodeRecord) -> NodeRecord:
        async with self.lock:
            self.require_leader()
            now = time.time()
            node = self.members.register(record, now)
            self._dirty_nodes.add(node.node_id)
            self.events.add(EV.EVENT_KIND_NODE_REGISTERED,
                            f"{node.role.value} {node.node_id} registered at {node.address}",
                            node_id=node.node_id, role=node.role.value)  # fmt: skip
            self._reconcile(now)
            await self._flush()
            return node

    async def heartbeat(
        self, node_id: str, epoch: int, step: int, step_time: float | None
    ) -> Directions:
        async with self.lock:
            self.require_leader()
            await self.check_node_epoch(epoch, f"node {node_id}")
            try:
                node = self.members.heartbeat(node_id, time.time(), step, step_time)
            except UnknownNode:
                raise StalwartError(
                    ErrorKind.UNKNOWN_NODE,
                    f"node {node_id!r} is not registered (lease lapsed?): register again",
                ) from None
            job_id, slots = self.holdings().get(node_id, ("", ()))
            job = self.jobs.get(job_id)
            draining = node.state in (NodeState.DRAINING, NodeState.DRAINED)
            return Directions(node, draining, job if job and not job.finished else None, slots)

    async def check_node_epoch(self, epoch: int, who: str) -> None:
        """A node's request carries a higher coordinator epoch than ours (caller holds the
        lock). Only the store says whether a newer leader exists: if it does, step down;
        if not, the number was never issued (a store wiped or replaced while the node
        lived on, a bug, a hostile caller) and the request is refused naming the leader's
        epoch, which the node then takes. A node's word alone never deposes the leader."""
        if epoch <= self.epoch:
            return
        stored = await self.io(self.state.stored_epoch)
        if stored > self.epoch:
            await self._fenced(f"{who} carries epoch {epoch}; the store holds {stored}")
            self.leader.saw_higher_epoch(stored)
            self.require_leader()
        # Nodes take the epoch this answer names (stalwart.client.coordinator.leaders_epoch):
        # only name it while still acting, so the store read above was made by the leader.
        self.require_leader()
        raise StalwartError(
            ErrorKind.UNKNOWN_EPOCH,
            f"coordinator epoch {epoch} was never issued (the leader's is {self.epoch}); "
            "use the epoch the leader answers with",
            epoch=self.epoch,
        )

    async def drain_node(
        self, node_id: str, reason: str, only_if_movable: bool = False
    ) -> NodeRecord:
        """Drain a trainer; ``only_if_movable`` (a predicted failure, not an operator's
        word): not when another trainer could not take a job's slot it holds, which
        would leave that job with no trainer on a guess."""
        async with self.lock:
            self.require_leader()
            node = self._node(node_id)
            if only_if_movable and not self._work_could_move(node_id):
                log.warning("not draining: no other trainer could take its slots",
                            node=node_id, reason=reason)  # fmt: skip
                return node
            if node.role in NOT_DRAINED:
                raise StalwartError(
                    ErrorKind.FAILED_PRECONDITION,
                    f"node {node_id!r} is a {node.role.value}: only trainers are drained "
                    "(their slots move to others); a replica of another service is taken "
                    "out by stopping it, and its group or election replaces it",
                )
            if self._start_drain(node, reason):
                self._reconcile(time.time())
                await self._flush()
            return node

    def _start_drain(self, node: NodeRecord, reason: str) -> bool:
        """Mark a trainer DRAINING (the caller reconciles, which moves its work); False
        when it is draining, drained or out of service already."""
        if drain.decide_drain(node.state) is not drain.DrainDecision.START:
            return False
        node.state = NodeState.DRAINING
        self._dirty_nodes.add(node.node_id)
        self._drain_reasons[node.node_id] = reason
        metrics.drain_started(node.node_id)  # a recovery's start: node_drained
        log.info("draining", node=node.node_id, reason=reason)
        return True

    async def undrain_node(self, node_id: str, release_quarantine: bool = False) -> NodeRecord:
        """Return a draining or drained node (a quarantined one with
        ``release_quarantine``) to service; placement gives it work again."""
        async with self.lock:
            self.require_leader()
            node = self._node(node_id)
            decision = drain.decide_undrain(node.state, release_quarantine)
            if decision is drain.UndrainDecision.REFUSE:
                hint = (" once its hardware was checked, release it with --release-quarantine"
                        if node.state is NodeState.QUARANTINED else "")  # fmt: skip
                raise StalwartError(
                    ErrorKind.FAILED_PRECONDITION,
                    f"node {node_id!r} is {node.state.value}: only a draining or drained "
                    f"node can be undrained{';' if hint else ''}{hint}",
                )
            if decision is drain.UndrainDecision.RESUME:
                was = node.state
                node.state = NodeState.ALIVE
                self._dirty_nodes.add(node_id)
                self._drain_reasons.pop(node_id, None)
                metrics.drain_ended(node_id)
                self.events.add(EV.EVENT_KIND_NODE_UNDRAINED,
                                f"node {node_id} back in service (was {was.value})",
                                node_id=node_id)  # fmt: skip
                log.info("undrained", node=node_id, was=was.value)
                self._reconcile(time.time())
                await self._flush()
            return node

    async def quarantine(self, node_id: str, reason: str) -> NodeRecord:
        """Corrupt numbers came from this node: it gets no more work (its slot moves to
        a standby) and stays QUARANTINED, heartbeats and re-registration included."""
        async with self.lock:
            self.require_leader()
            node = self._node(node_id)
            # a DEAD one too: the verdict may come after its process ended, and the
            # machine may register again
            if node.state is not NodeState.QUARANTINED:
                node.state = NodeState.QUARANTINED
                self._dirty_nodes.add(node_id)
                self.events.add(EV.EVENT_KIND_NODE_QUARANTINED,
                                f"node {node_id} quarantined: {reason}", node_id=node_id)  # fmt: skip
                log.warning("quarantined", node=node_id, reason=reason)
                self._reconcile(time.time())
                await self._flush()
            return node

    def node(self, node_id: str) -> NodeRecord:
        """A registered node (NOT_FOUND if none); leader only."""
        self.require_leader()
        return self._node(node_id)

    def _node(self, node_id: str) -> NodeRecord:
        node = self.members.nodes.get(node_id)
        if node is None:
            raise StalwartError(ErrorKind.NOT_FOUND, f"no node {node_id!r}")
        return node

    # --- jobs ----------------------------------------------------------------------

    async def create_job(self, job_id: str, spec, request_id: str) -> jobs.Job:
        async with self.lock:
            self.require_leader()
            if request_id:
                earlier = await self.io(self.state.request_job, request_id)
                if earlier is not None:
                    if earlier.job_id in self.jobs:
                        same = self.jobs[earlier.job_id]
                        _refuse_another_request(request_id, same, job_id, spec)
                        return same  # a retry: the same job
                    _refuse_forgotten(request_id, earlier)
                    job_id = earlier.job_id  # its record was never stored: admit it now
            job_id = job_id or f"job-{uuid.uuid4().hex[:10]}"
            if job_id in self.jobs:
                raise StalwartError(
                    ErrorKind.ALREADY_EXISTS, f"job {job_id!r} exists (another request)"
                )
            self._check_room_for_a_job()
            self._check_shard_groups(max(1, spec.num_shards))
            if request_id:
                await self.io(self.state.put_request, self.epoch, request_id, job_id)
            now = time.time()
            job = jobs.Job(job_id, spec.num_slots, spec.steps, now, spec=spec,
                           num_shards=max(1, spec.num_shards))  # fmt: skip
            self.jobs[job_id] = job
            self.live_jobs[job_id] = job
            self._dirty_jobs.add(job_id)
            self._job_event(
                job,
                f"job {job_id} admitted: {spec.model}, {spec.num_slots} slots, {spec.steps} steps",
            )
            self._reconcile(now)
            await self._flush()
            if request_id:
                await self.io(self.state.request_admitted, self.epoch, request_id, job_id)
            return job

    def _check_room_for_a_job(self) -> None:
        live = sum(not j.finished for j in self.live_jobs.values())
        if live >= self.settings.max_live_jobs:
            raise StalwartError(
                ErrorKind.LIMIT_EXCEEDED,
                f"{live} jobs are pending or running, the most this cluster admits "
                "(--max-live-jobs); cancel one or wait for one to end",
            )

    def _check_shard_groups(self, num_shards: int) -> None:
        """Refuse a job spread over more shard groups than the cluster has: its trainers
        would wait for ever for a primary of the groups missing. A cluster that has no
        paramserver yet (still starting) admits any count."""
        known = set(self.groups) | {
            n.shard for n in self.members.nodes.values() if n.role is Role.PARAMSERVER
        }
        missing = [k for k in range(num_shards) if k not in known]
        if known and missing:
            raise StalwartError(
                ErrorKind.FAILED_PRECONDITION,
                f"the job asks for {num_shards} shard groups; the cluster has paramservers "
                f"for shard {', '.join(map(str, sorted(known)))} only (none for "
                f"{', '.join(map(str, missing[:8]))}{' ...' if len(missing) > 8 else ''}): "
                "submit with fewer shards or start paramservers for the missing ones",
            )

    def job(self, job_id: str) -> jobs.Job:
        self.require_leader()
        job = self.jobs.get(job_id)
        if job is None:
            raise StalwartError(ErrorKind.UNKNOWN_JOB, f"no job {job_id!r}")
        return job

    async def cancel_job(self, job_id: str, reason: str) -> jobs.Job:
        async with self.lock:
            job = self.job(job_id)
            self._advance(job, jobs.Cancel(reason or "cancelled by request"), time.time())
            self._reconcile(time.time())
            await self._flush()
            return job

    async def task_error(self, job_id: str, error: taskerrors.TaskError) -> jobs.Job:
        """A trainer reports that the job's own code raised; fails the job when the
        error is the job's for sure (taskerrors.py). FAILED is final: nothing the
        platform can do changes the user's code."""
        async with self.lock:
            job = self.job(job_id)
            if error.node_id not in self.members.nodes:
                raise StalwartError(ErrorKind.UNKNOWN_NODE, f"no node {error.node_id!r}")
            if job.finished:
                return job
            log.warning("user code failed", job=job_id, node=error.node_id, phase=error.phase,
                        step=error.step, slot=error.slot, error=error.message)  # fmt: skip
            movable = self._another_trainer(error.node_id, job)
            reason = self.task_errors.record(job_id, error, movable)
            self._dirty_errors.add(job_id)  # counted in the store too: a new leader goes on
            now = time.time()
            if reason is not None:
                self._advance(job, jobs.Fail(reason), now)  # _flush forgets the counts
                self._reconcile(now)
            elif error.machine_fault and movable:  # that machine's, until another says so
                node = self.members.nodes[error.node_id]
                if self._start_drain(node, f"its device failed: {error.error_type}: "
                                           f"{error.message}"[: limits.MAX_REASON]):  # fmt: skip
                    self._reconcile(now)
            await self._flush()
            return job

    def _another_trainer(self, node_id: str, job: jobs.Job) -> bool:
        """Whether a trainer other than ``node_id`` is in service and could take its work
        on ``job``: idle, or already the job's (a slot or a standby place). One holding
        another job's slot or standing by for it is never given this job's slots, so
        counting it drained the job's only trainer and left the job with none."""
        others = {n for j in self.live_jobs.values()
                  if j.job_id != job.job_id and not j.finished for n in j.holders()}  # fmt: skip
        return any(
            n.role is Role.TRAINER and n.leased and n.state is NodeState.ALIVE
            and n.node_id != node_id and n.node_id not in others
            for n in self.members.nodes.values()
        )  # fmt: skip

    def _work_could_move(self, node_id: str) -> bool:
        """Whether every job whose slot ``node_id`` holds has another trainer for it."""
        return all(
            self._another_trainer(node_id, j) for j in self.live_jobs.values()
            if not j.finished and any(s.node_id == node_id for s in j.slots)
        )  # fmt: skip

    def _advance(self, job: jobs.Job, event: jobs.Event, now: float) -> None:
        old_step = job.step
        change = jobs.advance(job, event, now)
        if job.step != old_step:
            self._dirty_jobs.add(job.job_id)
            for step in range(max(old_step + 1, job.step - 999), job.step + 1):
                self.events.add(EV.EVENT_KIND_STEP_COMMITTED, f"step {step} committed",
                                job_id=job.job_id, step=step)  # fmt: skip
        if change is not None:
            self._dirty_jobs.add(job.job_id)
            if job.finished:
                self.finished_order[job.job_id] = None
                if self.sdc is not None:  # its batches are never checked again
                    self.sdc.checks.forget_job(job.job_id)
            self._job_event(
                job, f"job {job.job_id} {change.old.value} -> {change.new.value}: {change.reason}"
            )

    def _job_event(self, job: jobs.Job, message: str) -> None:
        self.events.add(EV.EVENT_KIND_JOB_STATE_CHANGED, message, job_id=job.job_id,
                        step=job.step, state=job.state.value)  # fmt: skip

    # --- the control loop ----------------------------------------------------------

    async def tick(self) -> None:
        """Expire leases, then place work. Called every tick while leading."""
        async with self.lock:
            self.require_leader()
            now = time.time()
            for node in self.members.expire(now):
                self._node_died(node, "lease expired")
            self._reconcile(now)
            self._forget_dead(now)
            if (
                self._dirty_jobs
                or self._dirty_nodes
                or self._forgotten_nodes
                or self._forgotten_jobs
                or self._dirty_groups
                or self.events.has_pending
            ):
                await self._flush()

    def _forget_dead(self, now: float) -> None:
        """Drop nodes dead for --forget-dead-after-seconds that no live job (slot or
        standby place) or shard group names any more."""

        def named() -> set[str]:
            return set(self.holdings()) | {primary for primary, _ in self.groups.values()}

        after_s = self.settings.forget_dead_after_seconds
        gone = self.members.forget_dead(now, after_s, named)
        for node_id in gone:
            self.views.pop(node_id, None)
        self._forgotten_nodes.update(gone)
        if gone:
            log.info("dead nodes forgotten", count=len(gone), first=gone[:10], after_s=after_s)

    def oldest_finished(self) -> list[str]:
        """The finished jobs past --keep-finished-jobs, oldest first, that placement has
        released (one still releasing its trainers waits for a later round)."""
        excess = len(self.finished_order) - self.settings.keep_finished_jobs
        out: list[str] = []
        for job_id in self.finished_order:
            if len(out) >= excess:
                break
            if job_id not in self.live_jobs:
                out.append(job_id)
        return out

    def forget_finished(self, forget: list[str], keep: list[str]) -> None:
        """Drop the records of ``forget`` (from memory here, from the store at the next
        flush); ``keep`` stay for good and no longer count against the limit (their
        checkpoints need them). Caller holds the lock."""
        for job_id in keep:
            self.finished_order.pop(job_id, None)
        for job_id in forget:
            job = self.jobs.get(job_id)
            if job is None or not job.finished or job_id in self.live_jobs:
                continue
            del self.jobs[job_id]
            self.finished_order.pop(job_id, None)
            self._forgotten_jobs.add(job_id)

    def _node_died(self, node: NodeRecord, why: str) -> None:
        self._dirty_nodes.add(node.node_id)
        self.events.add(EV.EVENT_KIND_NODE_DEAD, f"{node.role.value} {node.node_id} dead: {why}",
                        node_id=node.node_id)  # fmt: skip
        log.warning("node dead", node=node.node_id, role=node.role.value, why=why)

    def _reconcile(self, now: float) -> None:
        """Run placement and carry out its actions on the in-memory state."""
        for job_id in [i for i, j in self.live_jobs.items() if not _still_live(j)]:
            del self.live_jobs[job_id]
        actions = placement.decide(list(self.live_jobs.values()), self.members.nodes.values())
        if not actions:
            return
        changed = placement.apply(self.jobs, actions)
        for action in actions:
            self._announce(action)
        self._dirty_jobs |= changed
        for job_id in changed:
            self._advance(self.jobs[job_id], jobs.SlotsChanged(), now)

    def _announce(self, a: placement.Action) -> None:
        self._dirty_nodes.add(a.node_id)
        if isinstance(a, placement.MarkDrained):
            self.members.nodes[a.node_id].state = NodeState.DRAINED
            reason = self._drain_reasons.pop(a.node_id, "")
            self.events.add(
                EV.EVENT_KIND_NODE_DRAINED,
                f"node {a.node_id} drained" + (f": {reason}" if reason else ""),
                node_id=a.node_id, **({"reason": reason} if reason else {}),
            )  # fmt: skip
        elif isinstance(a, placement.Assign):
            job = self.jobs[a.job_id]
            kind = EV.EVENT_KIND_STANDBY_PROMOTED if a.from_standby else EV.EVENT_KIND_SLOT_ASSIGNED
            how = "standby promoted into" if a.from_standby else "assigned"
            if a.beside:
                how = "computes, beside its own,"
            self.events.add(kind, f"{a.node_id} {how} slot {a.slot} of {a.job_id} at step {job.step}",
                            job_id=a.job_id, node_id=a.node_id, step=job.step, slot=a.slot)  # fmt: skip
        elif isinstance(a, placement.AttachStandby):
            self.events.add(EV.EVENT_KIND_SLOT_ASSIGNED, f"{a.node_id} is a warm standby of {a.job_id}",
                            job_id=a.job_id, node_id=a.node_id, slot=-1)  # fmt: skip


def _refuse_another_request(request_id: str, job: jobs.Job, job_id: str, spec) -> None:
    """A request id sent again with another job id or spec is not a retry: answering
    with the first job would let the client believe its new spec was admitted."""
    if (job_id and job_id != job.job_id) or spec != job.spec:
        raise StalwartError(
            ErrorKind.INVALID_ARGUMENT,
            f"request {request_id!r} admitted job {job.job_id!r} with another "
            f"{'job id' if job_id and job_id != job.job_id else 'spec'}; a retry sends the "
            "same request, a new job needs a new request id",
        )


def _refuse_forgotten(request_id: str, earlier: RequestRecord) -> None:
    """A retried CreateJob whose job ended and was forgotten since: admitting it again
    would run a finished job twice."""
    if earlier.admitted:
        raise StalwartError(
            ErrorKind.ALREADY_EXISTS,
            f"request {request_id!r} admitted job {earlier.job_id!r}, which has ended and "
            "whose record is no longer kept (--keep-finished-jobs); a new job needs a new "
            "request id",
        )


def _still_live(job: jobs.Job) -> bool:
    """Unfinished, or finished with nodes placement has yet to release."""
    return not job.finished or bool(job.holders())


@dataclass
class _Dirty:
    """What one flush writes: ids of changed records, and of records to delete."""

    jobs: set[str]
    nodes: set[str]
    groups: set[int]
    nodes_gone: set[str]
    jobs_gone: set[str]
