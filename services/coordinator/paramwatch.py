"""Watching paramserver shard groups: poll every replica, promote, add backups, track progress.

One round: ask every live paramserver for GetReplicaStatus (outside the lock),
fold the answers into the leader's view, let ``promotion.decide`` say what each
group needs, carry that out with Promote / ConfigureReplica, and feed each
job's committed version (the primaries' version) to the job state machine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable

import grpc
import structlog

from services.coordinator import hangwatch, jobs, promotion
from services.coordinator.control import EV, Control
from services.coordinator.convert import REPLICA_ROLES_BACK
from services.coordinator.membership import NodeState, Role
from stalwart.api import common, paramserver, paramserver_grpc
from stalwart.errors import RpcError, StalwartError

log = structlog.get_logger(__name__)

STATUS_TIMEOUT_S = 0.5
COMMAND_TIMEOUT_S = 2.0
# Polls in a row without an answer after which a replica counts as slow: a backup
# that is slow gives its place to a warm spare (it is not declared dead for that).
SLOW_POLLS = 2


async def promote_with_backups(
    call, address: str, epoch: int, backups, coordinator_epoch: int, timeout: float
):
    """Configure the backups at ``epoch`` first, then promote ``address`` with those that
    took it. Replicas adopt an epoch only from the coordinator, so a backup not told of
    the new epoch would refuse the new primary's replication.

    ``call(address, method, request, timeout)`` makes one paramserver call."""
    told = await asyncio.gather(*(
        call(b, "ConfigureReplica", paramserver.ConfigureReplicaRequest(
            role=common.REPLICA_ROLE_BACKUP, epoch=epoch, coordinator_epoch=coordinator_epoch,
        ), timeout)
        for b in backups
    ), return_exceptions=True)  # fmt: skip
    kept = []
    for backup, answer in zip(backups, told, strict=True):
        if isinstance(answer, BaseException):
            log.warning(
                "backup not configured before a promotion", backup=backup, error=str(answer)
            )
        else:
            kept.append(backup)
    request = paramserver.PromoteRequest(
        epoch=epoch, backups=kept, coordinator_epoch=coordinator_epoch
    )
    return await call(address, "Promote", request, timeout)


class ReplicaLinks:
    """Cached stubs to paramserver replicas; every call has a deadline."""

    def __init__(self, open_channel: Callable[[str], grpc.aio.Channel]) -> None:
        self._open = open_channel
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, paramserver_grpc.ParamServerServiceStub] = {}

    def channel(self, address: str) -> grpc.aio.Channel:
        """The cached channel to ``address`` (also used to probe other nodes' health)."""
        if address not in self._channels:
            self._channels[address] = self._open(address)
        return self._channels[address]

    def stub(self, address: str) -> paramserver_grpc.ParamServerServiceStub:
        """Cached too: a stub builds one callable per method (~0.1 ms), and the
        leader polls every replica ten times a second."""
        if address not in self._stubs:
            self._stubs[address] = paramserver_grpc.ParamServerServiceStub(self.channel(address))
        return self._stubs[address]

    async def status(self, address: str) -> paramserver.GetReplicaStatusResponse:
        return await self._call(address, "GetReplicaStatus", paramserver.GetReplicaStatusRequest(),
                                STATUS_TIMEOUT_S)  # fmt: skip

    async def promote(
        self, address: str, epoch: int, backups: tuple[str, ...], coordinator_epoch: int
    ):
        return await promote_with_backups(
            self._call, address, epoch, backups, coordinator_epoch, COMMAND_TIMEOUT_S
        )

    async def configure(
        self, address: str, role: int, epoch: int, backups: tuple[str, ...] = (), *,
        coordinator_epoch: int,
    ):  # fmt: skip
        request = paramserver.ConfigureReplicaRequest(role=role, epoch=epoch, backups=list(backups),
                                                      coordinator_epoch=coordinator_epoch)  # fmt: skip
        return await self._call(address, "ConfigureReplica", request, COMMAND_TIMEOUT_S)

    async def delete_model(self, address: str, job_id: str, epoch: int):
        request = paramserver.DeleteModelRequest(job_id=job_id, epoch=epoch)
        return await self._call(address, "DeleteModel", request, COMMAND_TIMEOUT_S)

    async def _call(self, address: str, method: str, request, timeout: float):
        try:
            return await getattr(self.stub(address), method)(request, timeout=timeout)
        except grpc.RpcError as exc:
            raise RpcError.from_grpc(exc) from None

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self._channels.values()), return_exceptions=True)
        self._channels.clear()
        self._stubs.clear()


def refused(answer: BaseException) -> bool:
    """A poll refused outright (nothing listens at the port: the process is gone)."""
    return isinstance(answer, RpcError) and answer.code is grpc.StatusCode.UNAVAILABLE


class ParamWatch:
    def __init__(
        self,
        control: Control,
        links: ReplicaLinks,
        unreachable_polls: int,
        backups: int = 0,
        hung_step_seconds: float = 0.0,
    ) -> None:
        self.control = control
        self.links = links
        self.unreachable_polls = unreachable_polls
        self.backups = backups  # wanted per group; 0: every live replica
        self.hung_step_seconds = hung_step_seconds  # 0: hung trainers are not looked for
        self._failures: dict[str, int] = {}  # consecutive refused polls
        self._slow: dict[str, int] = {}  # consecutive polls that got no answer in time
        # per paramserver, per synchronous job it holds: the slots pushed for its step
        self._pushed: dict[str, dict[str, frozenset[int]]] = {}
        self._still = hangwatch.StillSince()
        # per paramserver, the process (instance id) whose state the group relies on
        self._instances: dict[str, str] = {}

    async def round(self) -> None:
        """One poll of every live paramserver, then the decisions it calls for."""
        c = self.control
        async with c.lock:
            c.require_leader()
            targets = [(n.node_id, n.address) for n in c.members.alive(Role.PARAMSERVER)]
            generation = c.restore_generation
        answers = await asyncio.gather(*(self.links.status(a) for _, a in targets),
                                       return_exceptions=True)  # fmt: skip
        async with c.lock:
            c.require_leader()
            for (node_id, address), answer in zip(targets, answers, strict=True):
                self._fold(node_id, address, answer)
            self._forget_gone(c.members.nodes.keys())
            hung: list[hangwatch.Hung] = []
            wedged: list[int] = []
            decisions: list[tuple[int, promotion.Decision]] = []
            # Answers from before a restore may predate its load: a restored primary
            # would look empty and be replaced, so they decide nothing.
            if generation == c.restore_generation:
                self._adopt_live_primaries()
                self._progress()
                hung, wedged = self._stalled_steps(time.monotonic())
                decisions = self._decisions()
            await c._flush()
        for shard, decision in decisions:
            await self._execute(shard, decision)
        for shard in wedged:
            await self._fail_over_wedged(shard)
        for h in hung:
            log.warning("trainer hung; draining it", node=h.node_id, job=h.job_id, step=h.step,
                        slots=list(h.slots), still_s=round(h.still_s, 1))  # fmt: skip
            try:
                await c.drain_node(h.node_id, h.reason)
            except StalwartError as exc:  # no longer leading, or the node just went
                log.warning("could not drain a hung trainer", node=h.node_id, error=str(exc))
        if c.checkpoints is not None:
            c.checkpoints.restore_lost_groups()

    def _forget_gone(self, known) -> None:
        """Drop what is kept per paramserver for nodes the leader forgot: with a
        random node id per process, each restart added entries for good."""
        for kept in (self._failures, self._slow, self._pushed, self._instances):
            for node_id in kept.keys() - known:
                del kept[node_id]

    def _fold(self, node_id: str, address: str, answer) -> None:
        c = self.control
        node = c.members.nodes.get(node_id)
        if node is None:
            return
        if isinstance(answer, BaseException):
            self._pushed.pop(node_id, None)  # unknown now: no trainer is judged on it
            if not refused(answer):
                # No answer in time: paused, overloaded or cut off. It may still be
                # working, so only the failure detector (its heartbeats) decides.
                self._slow[node_id] = self._slow.get(node_id, 0) + 1
                return
            self._failures[node_id] = self._failures.get(node_id, 0) + 1
            if self.unreachable_polls and self._failures[node_id] >= self.unreachable_polls:
                if c.members.declare_dead(node_id) is not None:
                    c._node_died(node, f"refused {self._failures[node_id]} polls")
            return
        self._failures[node_id] = 0
        self._slow[node_id] = 0
        self._pushed[node_id] = {
            j.job_id: frozenset(j.pushed_slots)
            for j in answer.jobs
            if j.mode == common.CONSISTENCY_MODE_SYNC
        }
        role = REPLICA_ROLES_BACK.get(answer.role, "")
        versions = {j.job_id: j.version for j in answer.jobs}
        c.views[node_id] = promotion.ReplicaView(
            node_id, address, True, role, answer.epoch, versions,
            tuple(b.address for b in answer.backups),
            restarted=self._restarted(node, answer.instance, versions),
            in_sync=tuple(b.address for b in answer.backups if b.in_sync),
        )  # fmt: skip
        if node.replica_role != role:
            node.replica_role = role
            c._dirty_nodes.add(node_id)

    def _restarted(self, node, instance: str, versions: dict[str, int]) -> bool:
        """Whether the replica answers from another process than the one polled before,
        behind what the group has: it lost its state in a restart.

        The old process stays remembered, and the replica flagged, until the new one
        holds what the group has: a recorded primary is replaced by a backup
        (``promotion.decide``), a backup is taken off its primary's list and added
        again, which installs its state (``promotion._unconfigured``)."""
        c = self.control
        primary_id, _ = c.groups.get(node.shard, ("", 0))
        is_primary = node.node_id == primary_id
        known = self._instances.get(node.node_id)
        if known is None and is_primary:  # a new leader: the one stored with the group
            known = c._primary_instance(node.shard) or None
        restarted = bool(known) and instance != known and self._behind(node, versions)
        if restarted:
            return True
        self._instances[node.node_id] = instance
        if is_primary and self._record_instance(node.shard, node.node_id):
            c._dirty_groups.add(node.shard)
        return False

    def _behind(self, node, versions: dict[str, int]) -> bool:
        """Whether ``versions`` (the replica's jobs) lack a job, or a version of one,
        that the group is known to have: committed steps on the leader's books, or
        what the group's other live replicas hold (ahead of the books by a poll)."""
        group = [r for r in self.group(node.shard) if r.alive and r.node_id != node.node_id]
        others = [self._committed_steps(node.shard), *(r.versions for r in group)]
        return promotion.behind(versions, others)

    def group(self, shard: int) -> list[promotion.ReplicaView]:
        """The shard's replicas with liveness from membership (dead ones keep their last epoch)."""
        c = self.control
        out = []
        for node in c.members.nodes.values():
            if node.role is not Role.PARAMSERVER or node.shard != shard:
                continue
            view = c.views.get(node.node_id) or promotion.ReplicaView(
                node.node_id, node.address, True
            )
            quarantined = node.state is NodeState.QUARANTINED
            alive = node.leased and node.state is not NodeState.DEAD and not quarantined
            slow = self._slow.get(node.node_id, 0) >= SLOW_POLLS
            out.append(promotion.ReplicaView(view.node_id, node.address, alive, view.role, view.epoch,
                                             view.versions, view.backups, quarantined, slow,
                                             view.restarted, view.in_sync))  # fmt: skip
        return out

    def shards(self) -> list[int]:
        nodes = self.control.members.nodes.values()
        return sorted({n.shard for n in nodes if n.role is Role.PARAMSERVER})

    def _adopt_live_primaries(self) -> None:
        c = self.control
        for shard in self.shards():
            if shard in c.lost_groups:
                continue  # a fresh replica claiming primary holds no state: restore first
            primary_id, recorded_epoch = c.groups.get(shard, ("", 0))
            primary = promotion.live_primary(
                self.group(shard), recorded_epoch, primary_id, self._committed(shard)
            )
            if primary is not None and c.groups.get(shard) != (primary.node_id, primary.epoch):
                c.groups[shard] = (primary.node_id, primary.epoch)
                self._record_instance(shard, primary.node_id)
                c._dirty_groups.add(shard)

    def _record_instance(self, shard: int, primary_id: str) -> bool:
        """Keep the process last polled of the group's recorded primary with the group,
        to be written with it (at a promotion or adoption, in the same write: the next
        poll would, but a leader may die before it). True when it changed."""
        instance = self._instances.get(primary_id)
        c = self.control
        if not instance or c.primary_instances.get(shard) == (primary_id, instance):
            return False
        c.primary_instances[shard] = (primary_id, instance)
        return True

    def _decisions(self) -> list[tuple[int, promotion.Decision]]:
        c = self.control
        out = []
        for shard in self.shards():
            if shard in c.lost_groups:
                continue  # restored from a checkpoint (checkpoints.py), never promoted empty
            primary_id, recorded_epoch = c.groups.get(shard, ("", 0))
            decided = promotion.decide(
                self.group(shard), primary_id, self._committed(shard), self.backups, recorded_epoch
            )
            out += [(shard, self._handed_out(shard, d)) for d in decided]
        return out

    def _handed_out(self, shard: int, decision: promotion.Decision) -> promotion.Decision:
        """A promotion at an epoch no other decision of this leader took (caller holds
        the lock; see Control.hand_out_epoch)."""
        if not isinstance(decision, promotion.Promote):
            return decision
        return dataclasses.replace(
            decision, epoch=self.control.hand_out_epoch(shard, decision.epoch)
        )

    def _committed(self, shard: int) -> frozenset[str]:
        """The live jobs with committed steps on ``shard`` (their state exists there)."""
        return frozenset(self._committed_steps(shard))

    def _committed_steps(self, shard: int) -> dict[str, int]:
        """Those jobs with their committed steps."""
        return {
            j.job_id: j.step for j in self.control.live_jobs.values()
            if not j.finished and shard < j.num_shards and j.step > 0
        }  # fmt: skip

    def _progress(self) -> None:
        """Each active job's committed step is the lowest version among its shards' primaries."""
        c = self.control
        now = time.time()
        for job in c.live_jobs.values():
            if job.finished:
                continue
            versions = [self._primary_version(k, job.job_id) for k in range(job.num_shards)]
            if versions and all(v is not None for v in versions):
                c._advance(job, jobs.Progress(min(versions)), now)

    def _stalled_steps(self, now: float) -> tuple[list[hangwatch.Hung], list[int]]:
        """The trainers that hold up a synchronous job's step, and the shard groups whose
        primary holds every push of it without committing (hangwatch.py)."""
        c = self.control
        running = [j for j in c.live_jobs.values() if j.state is jobs.JobState.RUNNING]
        self._still.keep_only([j.job_id for j in running])
        if self.hung_step_seconds <= 0:
            return [], []
        hung: list[hangwatch.Hung] = []
        stuck: set[int] = set()
        busy = {s.node_id: j.job_id for j in running for s in j.slots if s.node_id}
        trainers = [n for n in c.members.alive(Role.TRAINER) if n.state is NodeState.ALIVE]
        for job in running:
            holders = {s.index: s.node_id for s in job.slots if s.node_id}
            # a new holder or a new primary (a drain or a fail-over done) starts the count again
            primaries = tuple(c.groups.get(k, ("", 0)) for k in range(job.num_shards))
            state = (job.step, tuple(sorted(holders.items())), primaries)
            still = self._still.observe(job.job_id, state, now)
            by_shard = self._pushed_by_shard(job)
            if not by_shard:
                continue  # not synchronous, a primary's answer missing, or no shard at the step
            limit = hangwatch.limit_s(self.hung_step_seconds, self._slowest(holders.values()))
            pushed = frozenset.intersection(*by_shard.values())
            hung += self._hung_holders(job, still, limit, holders, pushed, busy, trainers)
            stuck.update(hangwatch.stuck_shards(still, limit, job.num_slots, by_shard))
        return hung, sorted(stuck)

    def _hung_holders(
        self, job, still, limit, holders, pushed, busy, trainers
    ) -> list[hangwatch.Hung]:
        """``busy``: node -> the job whose slot it holds; ``trainers``: the ALIVE ones."""
        c = self.control
        suspects = {n for k, n in holders.items() if k not in pushed}
        others = sum(
            1 for n in trainers
            if n.node_id not in suspects and busy.get(n.node_id, job.job_id) == job.job_id
        )  # fmt: skip
        found = hangwatch.hung_holders(job.job_id, job.step, still, limit, holders, pushed, others)
        return [h for h in found if c.members.nodes[h.node_id].state is NodeState.ALIVE]

    def _slowest(self, node_ids) -> float:
        nodes = self.control.members.nodes
        return max((nodes[n].step_time_ema for n in node_ids if n in nodes), default=0.0)

    def _pushed_by_shard(self, job: jobs.Job) -> dict[int, frozenset[int]] | None:
        """Per shard whose primary is at ``job``'s step: the slots pushed for it there
        (shards already past it are left out). None when a primary's answer is missing
        or the job is not synchronous."""
        out = {}
        for shard in range(job.num_shards):
            primary_id = self.control.groups.get(shard, ("", 0))[0]
            here = self._pushed.get(primary_id, {}).get(job.job_id)
            version = self._primary_version(shard, job.job_id)
            if here is None or version is None:
                return None
            if version == job.step:
                out[shard] = here
        return out

    async def _fail_over_wedged(self, shard: int) -> None:
        """A primary holds every push of a step and has not committed it for the limit:
        its commit path is wedged. Its group fails over to a backup it replicated to,
        as if it had died (the higher epoch fences it)."""
        c = self.control
        async with c.lock:
            c.require_leader()
            primary_id, recorded_epoch = c.groups.get(shard, ("", 0))
            group = [dataclasses.replace(r, alive=False) if r.node_id == primary_id else r
                     for r in self.group(shard)]  # fmt: skip
            decision = promotion.choose_promotion(group, self._committed(shard), recorded_epoch)
            decision = self._handed_out(shard, decision)
        if not isinstance(decision, promotion.Promote):
            log.warning("primary's commit looks wedged; no backup to take over", shard=shard,
                        primary=primary_id)  # fmt: skip
            return
        log.error("primary's commit wedged: every push of the step arrived, none committed; "
                  "failing over", shard=shard, primary=primary_id, to=decision.node_id)  # fmt: skip
        await self._execute(shard, decision)

    def _primary_version(self, shard: int, job_id: str) -> int | None:
        c = self.control
        primary_id = c.groups.get(shard, ("", 0))[0]
        view = c.views.get(primary_id)
        return view.versions.get(job_id) if view is not None and view.role == "primary" else None

    # --- carrying decisions out ----------------------------------------------------

    async def _execute(self, shard: int, decision: promotion.Decision) -> None:
        try:
            if isinstance(decision, promotion.Promote):
                await self._promote(shard, decision)
            elif isinstance(decision, promotion.AddBackup):
                await self._add_backup(decision)
            elif isinstance(decision, promotion.DropBackups):
                await self.links.configure(decision.primary_address, common.REPLICA_ROLE_PRIMARY,
                                           decision.epoch, decision.backups,
                                           coordinator_epoch=self.control.epoch)  # fmt: skip
                log.warning("backups dropped", primary=decision.primary_address,
                            backups=list(decision.backups))  # fmt: skip
            else:
                await self._group_lost(shard, decision)
        except RpcError as exc:
            log.warning(
                "paramserver command failed", shard=shard, decision=repr(decision), error=str(exc)
            )

    async def _promote(self, shard: int, d: promotion.Promote) -> None:
        c = self.control
        async with c.lock:
            c.require_leader()  # a deposed leader must not command
        await self.links.promote(d.address, d.epoch, d.backups, c.epoch)
        async with c.lock:
            c.require_leader()
            previous = c.groups.get(shard, ("", 0))[0]  # whose death this recovers from
            c.groups[shard] = (d.node_id, d.epoch)
            self._record_instance(shard, d.node_id)
            c._dirty_groups.add(shard)
            again = " again (above a stray claim)" if previous == d.node_id else ""
            c.events.add(EV.EVENT_KIND_REPLICA_PROMOTED,
                         f"paramserver {d.node_id} promoted to primary of shard {shard} at epoch "
                         f"{d.epoch}{again}",
                         node_id=d.node_id, shard=shard, epoch=d.epoch, previous=previous)  # fmt: skip
            await c._flush()
        log.warning("promoted paramserver", node=d.node_id, shard=shard, epoch=d.epoch)

    async def _add_backup(self, d: promotion.AddBackup) -> None:
        async with self.control.lock:
            self.control.require_leader()
        epoch = self.control.epoch
        await self.links.configure(d.address, common.REPLICA_ROLE_BACKUP, d.epoch,
                                   coordinator_epoch=epoch)  # fmt: skip
        await self.links.configure(d.primary_address, common.REPLICA_ROLE_PRIMARY, d.epoch,
                                   d.backups, coordinator_epoch=epoch)  # fmt: skip
        log.info("added paramserver backup", backup=d.address, primary=d.primary_address)

    async def _any_answers(self, replicas: list[tuple[str, str]], jobs_held: set[str]) -> bool:
        """Does a replica declared dead still answer, as itself, holding the jobs?
        (A stand-in on the same address would answer empty: that group is lost.)"""
        answers = await asyncio.gather(*(self.links.status(a) for _, a in replicas),
                                       return_exceptions=True)  # fmt: skip
        return any(
            not isinstance(a, BaseException)
            and a.node_id in (node_id, "")
            and jobs_held <= {j.job_id for j in a.jobs}
            for (node_id, _), a in zip(replicas, answers, strict=True)
        )

    async def _group_lost(self, shard: int, d: promotion.GroupLost) -> None:
        """Every replica is gone: jobs with a checkpoint wait for new replicas and a
        restore (checkpoints.py); jobs without one fail."""
        c = self.control
        async with c.lock:
            c.require_leader()
            if shard in c.lost_groups:
                return
            affected = [j for j in c.live_jobs.values() if not j.finished and shard < j.num_shards]
            dead = [(v.node_id, v.address) for v in self.group(shard)
                    if v.address and not v.alive and not v.quarantined]  # fmt: skip
        if await self._any_answers(dead, {j.job_id for j in affected}):
            # Declared dead, yet a replica answers: it was only slow (a paused
            # leader's successor, an overloaded machine). Its next heartbeat is
            # refused as unknown, it registers again and the group comes back;
            # failing the job now would be final for a job that can go on.
            log.warning("shard group looks lost but a replica answers; not failing its jobs",
                        shard=shard)  # fmt: skip
            return
        saved = set()
        if c.checkpoints is not None:
            for job in affected:
                try:
                    if await c.checkpoints.list(job.job_id):
                        saved.add(job.job_id)
                except StalwartError as exc:
                    # FAILED is final: a job whose checkpoints could not be listed
                    # may have one. Nothing is decided; the next poll round asks again.
                    log.warning("checkpoint store unreadable; the lost group's jobs wait",
                                shard=shard, job=job.job_id, error=str(exc))  # fmt: skip
                    return
        async with c.lock:
            c.require_leader()
            now = time.time()
            for job in affected:
                if job.job_id not in saved:
                    c._advance(job, jobs.Fail(f"paramserver shard {shard}: {d.reason}"), now)
            if saved:
                c.lost_groups.add(shard)
                c._dirty_groups.add(shard)
                for job_id in sorted(saved):
                    c.events.add(EV.EVENT_KIND_NODE_DEAD,
                                 f"every replica of paramserver shard group {shard} lost; "
                                 f"waiting for new replicas to restore {job_id} from a checkpoint",
                                 job_id=job_id, shard=shard)  # fmt: skip
                log.error("paramserver shard group lost; restore pending", shard=shard,
                          jobs=sorted(saved))  # fmt: skip
            c._reconcile(now)
            await c._flush()
