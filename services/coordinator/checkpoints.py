"""The leader's checkpoint orchestration: orders, catalog, retention, tiering, restores.

Saving (every ``checkpoint_interval`` steps of a running job, or on command):
ask every shard primary for ``SaveCheckpoint`` at the same version (sync mode:
every shard snapshots the same step), with the job's newest checkpoint as the
parent (delta), gather their parts, build the manifest and publish it
atomically in the checkpoint store. The store's manifests *are* the catalog;
the coordination store only counts each job's checkpoints (for tiering).
Then retention keeps the newest ``keep_checkpoints`` (and the chunks and patch
bases they name) and every ``durable_every``-th checkpoint is copied to the
durable ``file://`` tier.

Checking: while the primaries snapshot, every live replica of each group is
asked for its fingerprint at exactly the checkpoint's version, and
``replicacheck.judge`` votes. A checkpoint is published only when its
primary's copy is trusted; outvoted replicas are quarantined, and a group with
no majority sends the job back to its newest checkpoint (see replicacheck.py).

Restoring (on command, or when every replica of a shard group was lost and
new ones registered): pick the checkpoint (the newest that verifies; corrupt
ones are skipped, logged and counted), promote one live replica per shard group
under a new epoch, ``LoadCheckpoint`` there (it replicates to its backups),
then rewind the job's step. Trainers follow: the new epoch changes the shard
map, and in sync mode they compute whatever version the paramserver holds.

Deleting: content addressing plus full manifests make checkpoints
independent; deleting one removes only the chunks no other manifest names
(patch bases included), so no delta ever depends on a deleted parent.

The network and store work runs outside ``Control.lock``; state changes are
made under it and flushed under the coordinator epoch.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc
import structlog

from services.coordinator import ckptplan, jobs, replicacheck
from services.coordinator.control import EV, Control
from services.coordinator.paramwatch import promote_with_backups
from services.coordinator.promotion import ReplicaView
from services.coordinator.settings import CoordinatorSettings
from stalwart import checkpoint as ckpt
from stalwart.api import common, paramserver, paramserver_grpc
from stalwart.errors import ErrorKind, RpcError, StalwartError
from stalwart.retention import TierPolicy

log = structlog.get_logger(__name__)

STATUS_TIMEOUT_S = 1.0
PAST_RETRIES = 5  # on-command orders re-aimed when a commit overtook them
PAST_AHEAD = 2  # steps further ahead each re-aimed order is
# A periodic order waits this long for the job to reach its version, then is aimed
# again: a slow job is not counted as a failed order (which skips a mark), and a job
# that stopped short of the version is checkpointed where it stands (ckptplan)
ORDER_REACH_S = 10.0


def _retrieved(future: asyncio.Future) -> None:
    """Mark a dropped future's outcome as seen (asyncio logs one never retrieved)."""
    with contextlib.suppress(asyncio.CancelledError):
        future.exception()


class NotHeldYet(StalwartError):
    """A shard primary does not hold the job yet (its model was not registered there)."""


class NoVerifiedCheckpoint(StalwartError):
    """The job has no checkpoint that verifies (none taken, or every one corrupt)."""


@dataclass
class _Marks:
    """What the periodic orders of one job remember between ticks (ckptplan.next_order)."""

    last_saved: int = -1  # newest checkpoint's version; -1 until learnt from the store
    last_failed: int = -1  # the last order that failed other than by being overtaken
    aimed: int = -1  # the order under way
    seen: int = -1  # the version the previous look at the primaries found


class Checkpoints:
    def __init__(
        self,
        control: Control,
        stub_for: Callable[[str], paramserver_grpc.ParamServerServiceStub],
        group_of: Callable[[int], list[ReplicaView]],
        settings: CoordinatorSettings,
    ) -> None:
        self.c = control
        self.stub_for = stub_for
        self.group_of = group_of
        self.settings = settings
        self.url = settings.checkpoint_store_url
        self.pool = ckpt.StorePool()
        self.tier = TierPolicy(settings.durable_every if settings.durable_url else 0)
        self._job_locks: dict[str, asyncio.Lock] = {}
        self._inflight: dict[str, asyncio.Task] = {}
        self._marks: dict[str, _Marks] = {}  # by job id
        self._restore_lock = asyncio.Lock()
        self._restoring: asyncio.Task | None = None
        self._sweeping: asyncio.Task | None = None
        self._swept_at = time.monotonic()  # a new leader waits one interval first
        # jobs restored since their groups were lost, while another job of those
        # groups still waits for its restore (it failed, and is tried again)
        self._restored_after_loss: set[str] = set()

    # --- stores ---------------------------------------------------------------------

    def store(self):
        return self.pool.get(self.url)  # UNAVAILABLE naming the URL if unreachable

    async def _io(self, fn: Callable, *args, timeout: float | None = None):
        limit = timeout or self.settings.checkpoint_timeout_seconds
        try:
            return await asyncio.wait_for(asyncio.to_thread(fn, *args), limit)
        except TimeoutError:
            raise StalwartError(
                ErrorKind.UNAVAILABLE, f"checkpoint store {self.url} timed out after {limit:.0f}s"
            ) from None

    def close(self) -> None:
        self.pool.close()

    # --- catalog (the store's manifests) -------------------------------------------

    async def list(self, job_id: str) -> list[common.CheckpointManifest]:
        manifests, unreadable = await self._io(ckpt.list_checkpoints, self.store(), job_id)
        for checkpoint_id, reason in unreadable:
            log.warning("unreadable manifest", job=job_id, checkpoint=checkpoint_id, reason=reason)
        return manifests

    async def find(self, checkpoint_id: str) -> common.CheckpointManifest:
        """A checkpoint by id, in the job its id names or else in any known job."""
        job_id = ckptplan.job_of(checkpoint_id)
        candidates = [job_id] if job_id else sorted(self.c.jobs)
        for job in candidates:
            try:
                return await self._io(ckpt.load_manifest, self.store(), job, checkpoint_id)
            except StalwartError as exc:
                if exc.kind is not ErrorKind.NOT_FOUND:
                    raise
        raise StalwartError(ErrorKind.NOT_FOUND, f"no checkpoint {checkpoint_id!r}")

    async def verify(self, manifest: common.CheckpointManifest) -> ckpt.VerifyReport:
        return await self._io(ckpt.verify, self.store(), manifest)

    async def delete(self, checkpoint_id: str) -> int:
        """Unpublish a checkpoint and collect the chunks nothing else names."""
        manifest = await self.find(checkpoint_id)
        async with self._job_lock(manifest.job_id):  # not while a save of the job publishes
            others = [j for j in self.c.jobs if j != manifest.job_id]

            def remove() -> int:
                return ckpt.delete_checkpoint(
                    self.store(), manifest.job_id, checkpoint_id, live_jobs=others
                )

            collected = await self._io(remove)
        log.info("checkpoint deleted", checkpoint=checkpoint_id, chunks=collected)
        return collected

    # --- saving ---------------------------------------------------------------------

    def _job_lock(self, job_id: str) -> asyncio.Lock:
        return self._job_locks.setdefault(job_id, asyncio.Lock())

    async def round(self) -> None:
        """Order the periodic checkpoints that are due (called every tick while leading)."""
        async with self.c.lock:
            self.c.require_leader()
            due = [
                j.job_id
                for j in self.c.live_jobs.values()
                if j.state is jobs.JobState.RUNNING
                and j.spec is not None
                and j.spec.checkpoint_interval > 0
                and j.job_id not in self._inflight
                and not self._lost(j)
            ]
            for gone in self._marks.keys() - self.c.live_jobs.keys():
                del self._marks[gone]  # a new leader or a resume learns them again
            for gone in self._job_locks.keys() - self.c.live_jobs.keys():
                if not self._job_locks[gone].locked():  # nobody holds or waits on it
                    del self._job_locks[gone]
        if self._restoring is not None and not self._restoring.done():
            return  # a restore rewinds versions: order nothing meanwhile
        if self._sweeping is not None and not self._sweeping.done():
            return  # no upload may start while unpublished chunks are swept
        if self._sweep_due(time.monotonic()):
            self._sweeping = asyncio.create_task(self._sweep())
            return
        for job_id in due:
            task = asyncio.create_task(self._periodic(job_id))
            self._inflight[job_id] = task
            task.add_done_callback(lambda _t, j=job_id: self._inflight.pop(j, None))

    def _sweep_due(self, now: float) -> bool:
        """Whether to sweep the store now: the interval has passed and nothing of this
        leader's is being saved, restored or deleted (its chunks may be unpublished)."""
        every = self.settings.checkpoint_gc_seconds
        return (
            every > 0 and now - self._swept_at >= every and not self._inflight
            and not any(lock.locked() for lock in self._job_locks.values())
            and not self._restore_lock.locked()
        )  # fmt: skip

    async def _sweep(self) -> int:
        """Delete the chunks no manifest in the store names (every job's counts, this
        cluster's or not); rounds order no checkpoint meanwhile."""
        self._swept_at = time.monotonic()
        try:
            swept = await self._io(ckpt.collect_garbage, self.store(), list(self.c.jobs))
        except StalwartError as exc:
            log.warning("checkpoint store sweep failed", error=str(exc))
            return 0
        if swept:
            log.info("checkpoint store swept", chunks=swept)
        return swept

    def _marks_of(self, job_id: str) -> _Marks:
        return self._marks.setdefault(job_id, _Marks())

    def _lost(self, job: jobs.Job) -> bool:
        return any(k in self.c.lost_groups for k in range(job.num_shards))

    async def _periodic(self, job_id: str) -> None:
        """One periodic checkpoint of ``job_id`` when one is due (ckptplan.next_order)."""
        marks = self._marks_of(job_id)
        marks.aimed = -1
        try:
            async with self.c.lock:
                job = self.c.job(job_id)
                targets = self._primaries(job)
            version = await self._version(job_id, targets)
            stalled_at = version if version == marks.seen else None
            marks.seen = version
            if self._aim(job, version, stalled=version == stalled_at) is None:
                return  # nothing due before the last step: no store work
            # aimed again once the store work is done, at the version the primaries
            # hold then: a fast job would otherwise overtake a catch-up order
            await self.save(
                job_id,
                lambda now: self._aim(job, now, announce=True, stalled=now == stalled_at),
                reach_s=ORDER_REACH_S,
            )
        except NotHeldYet as exc:
            # a new job whose model has not reached its paramservers yet: asked again
            # next tick, and no order failed (the back-off of _failed stays as it was)
            log.debug("periodic checkpoint waits for the model", job=job_id, error=str(exc))
        except StalwartError as exc:
            if exc.kind.reason != "NOT_LEADER":
                self._failed(job_id, exc)
        except RpcError as exc:
            if exc.kind is ErrorKind.FAILED_PRECONDITION:  # overtaken or not reached yet
                log.debug("periodic checkpoint aims again", job=job_id, error=str(exc))
            else:
                self._failed(job_id, exc)

    def _aim(
        self, job: jobs.Job, current: int, announce: bool = False, stalled: bool = False
    ) -> int | None:
        marks = self._marks_of(job.job_id)
        order = ckptplan.next_order(current, job.spec.checkpoint_interval, job.steps,
                                    marks.last_saved, marks.last_failed, stalled)  # fmt: skip
        if order is None:
            return None
        if announce and order.passed:
            log.info("periodic checkpoint covers passed marks", job=job.job_id, at=order.at,
                     version=current, passed=order.passed, stalled=stalled)  # fmt: skip
        marks.aimed = order.at
        return order.at

    def _failed(self, job_id: str, exc: Exception) -> None:
        """Back off: the next order is at a mark above this one (ckptplan.next_order)."""
        marks = self._marks_of(job_id)
        marks.last_failed = marks.aimed
        log.warning("periodic checkpoint failed", job=job_id, error=str(exc))

    async def create(self, job_id: str) -> common.CheckpointManifest:
        """A checkpoint now (CreateCheckpoint): at the version the primaries hold."""
        async with self.c.lock:
            job = self.c.job(job_id)
            if job.state is not jobs.JobState.RUNNING:
                raise StalwartError(
                    ErrorKind.FAILED_PRECONDITION,
                    f"job {job_id} is {job.state.value}: checkpoints are taken of running jobs",
                )
        for attempt in range(PAST_RETRIES):
            async with self.c.lock:
                targets = self._primaries(self.c.job(job_id))
            # A commit overtook the last order (the job moves a step while the order
            # is prepared): aimed further ahead each time, where the primaries wait for
            # it. Aimed at the version held again, a fast job overtook all five.
            at = await self._version(job_id, targets, highest=True) + PAST_AHEAD * attempt
            try:
                return await self.save(job_id, at)
            except RpcError as exc:
                if exc.kind is not ErrorKind.FAILED_PRECONDITION:
                    raise
                last = exc
        raise StalwartError(
            ErrorKind.UNAVAILABLE,
            f"job {job_id} moved past every version asked ({PAST_RETRIES} tries, the last: "
            f"{last.message}); try again",
        )

    def _primaries(self, job: jobs.Job) -> list[tuple[int, str, int]]:
        """(shard, address, epoch) of each shard group's live primary; UNAVAILABLE if one has none."""
        out = []
        for shard in range(job.num_shards):
            primary_id, epoch = self.c.groups.get(shard, ("", 0))
            node = self.c.members.nodes.get(primary_id)
            if shard in self.c.lost_groups or node is None or not node.leased:
                raise StalwartError(
                    ErrorKind.UNAVAILABLE,
                    f"shard group {shard} of {job.job_id} has no live primary",
                )
            out.append((shard, node.address, epoch))
        return out

    async def _version(self, job_id: str, targets, highest: bool = False) -> int:
        """The job's version on its primaries now (lowest, or highest)."""
        answers = await asyncio.gather(*(
            self._call(address, "GetReplicaStatus", paramserver.GetReplicaStatusRequest(),
                       STATUS_TIMEOUT_S) for _, address, _ in targets
        ))  # fmt: skip
        versions = [next((j.version for j in a.jobs if j.job_id == job_id), None) for a in answers]
        version = ckptplan.job_version(versions, highest)
        if version is None:
            raise NotHeldYet(ErrorKind.UNAVAILABLE, f"a primary does not hold {job_id} yet")
        return version

    async def save(
        self, job_id: str, at: int | Callable[[int], int | None], reach_s: float = 0.0
    ) -> common.CheckpointManifest | None:
        """Checkpoint every shard of ``job_id`` at version ``at`` and publish it.

        ``at`` may be ``aim(version)``, called once the store is ready with the
        version the primaries hold then; when it returns None nothing is saved.
        ``reach_s``: how long the primaries wait for ``at`` before answering
        FAILED_PRECONDITION (0: for the whole call)."""
        async with self._job_lock(job_id):
            async with self.c.lock:
                job = self.c.job(job_id)
                targets = self._primaries(job)
                voters = {shard: self._voters(job_id, shard) for shard, _, _ in targets}
                spec = job.spec
            parent = await self._prepare(job_id)
            if callable(at):
                aimed = at(await self._version(job_id, targets))
                if aimed is None:
                    return None
                at = aimed
            checkpoint_id = ckptplan.checkpoint_id(job_id, at)
            started = time.monotonic()
            printing = asyncio.gather(*(
                self._fingerprint(address, job_id, at)
                for group in voters.values() for address in group.values()
            ), return_exceptions=True)  # fmt: skip
            try:
                parts = await asyncio.gather(*(
                    self._call(address, "SaveCheckpoint", paramserver.SaveCheckpointRequest(
                        job_id=job_id, checkpoint_id=checkpoint_id, store_url=self.url,
                        parent_id=parent, at_version=at, epoch=epoch, reach_timeout_seconds=reach_s,
                    ), self.settings.checkpoint_timeout_seconds)
                    for _, address, epoch in targets
                ))  # fmt: skip
            except BaseException:
                printing.cancel()  # the replicas' fingerprints wait for a version nobody saves
                printing.add_done_callback(_retrieved)
                raise
            verdicts = self._judge(targets, voters, await printing, at)
            await self._act_on(job_id, at, verdicts)
            refused = [
                f"shard {k}: replica fingerprints disagree ({replicacheck.describe(got)})"
                for k, judged, got in verdicts
                if not judged.publish
            ]
            if refused:
                raise StalwartError(ErrorKind.DATA_LOSS,
                                    f"checkpoint of {job_id} at version {at} not published: "
                                    + "; ".join(refused))  # fmt: skip
            manifest = ckpt.build_manifest(
                job_id=job_id, checkpoint_id=checkpoint_id, step=at,
                tensors=[t for p in parts for t in p.tensors],
                shards=[p.shard for p in parts], parent_id=parent, store_url=self.url,
                written_bytes=sum(p.written_bytes for p in parts), optimizer=spec.optimizer,
                consistency=parts[0].consistency, num_slots=parts[0].num_slots,
                data_position=common.DataPosition(step=at, seed=spec.seed),
                gradient_dtype=spec.gradient_dtype,
            )  # fmt: skip
            await self._io(ckpt.publish, self.store(), manifest)
            marks = self._marks_of(job_id)
            marks.last_saved, marks.last_failed = max(marks.last_saved, at), -1
            seconds = time.monotonic() - started
            taken = await self._record_saved(manifest, seconds)
            await self._after_save(manifest, taken)
        return manifest

    async def _prepare(self, job_id: str) -> str:
        """The parent of the next checkpoint (its newest, "" if none), with room made.

        Retention runs first when the store is short of room; refused
        (RESOURCE_EXHAUSTED) when even that is not enough: training goes on and
        the newest checkpoint stays. A new leader learns the newest version here."""
        newest = await self.list(job_id)
        marks = self._marks_of(job_id)
        if marks.last_saved < 0:
            marks.last_saved = newest[0].step if newest else 0
        others = [j for j in self.c.jobs if j != job_id]
        needed = newest[0].total_bytes if newest else 0
        await self._io(lambda: ckpt.make_room(self.store(), job_id, needed, live_jobs=others))
        return newest[0].checkpoint_id if newest else ""

    # --- replica fingerprints (decisions in replicacheck.py) --------------------------

    def _voters(self, job_id: str, shard: int) -> dict[str, str]:
        primary_id = self.c.groups.get(shard, ("", 0))[0]
        return replicacheck.voters(self.group_of(shard), primary_id, job_id)

    async def _fingerprint(self, address: str, job_id: str, at: int) -> int:
        request = paramserver.GetFingerprintRequest(job_id=job_id, at_version=at)
        answer = await self._call(address, "GetFingerprint", request,
                                  self.settings.checkpoint_timeout_seconds)  # fmt: skip
        return answer.combined

    def _judge(self, targets, voters, answers, at: int):
        """[(shard, Judgement, {node: fingerprint})]; replicas that could not answer do not vote."""
        answers = iter(answers)
        prints = {shard: {node: next(answers) for node in group} for shard, group in voters.items()}
        out = []
        for shard, _, _ in targets:
            got = {n: crc for n, crc in prints[shard].items() if isinstance(crc, int)}
            for node, failed in prints[shard].items():
                if not isinstance(failed, int):
                    log.info("replica did not fingerprint", node=node, version=at,
                             error=str(failed))  # fmt: skip
            primary_id = self.c.groups.get(shard, ("", 0))[0]
            judged = replicacheck.judge(primary_id, got)
            out.append((shard, judged, got))
        return out

    async def _act_on(self, job_id: str, at: int, verdicts) -> None:
        """Quarantine the outvoted; with no majority, go back to the last agreed checkpoint."""
        guard = self.c.sdc
        for shard, judged, got in verdicts:
            if judged.agree:
                continue
            why = (f"paramserver replicas of shard {shard} disagree on {job_id} at version "
                   f"{at} ({replicacheck.describe(got)})")  # fmt: skip
            for node in judged.quarantine:
                await guard.quarantine(node, "fingerprint", why)
            if judged.restore:
                await guard.unattributed("fingerprint", why, job_id, at, sorted(got))
                self._restore_later(job_id, f"{why}; no majority")

    def _restore_later(self, job_id: str, why: str) -> None:
        """Restore once the caller's save has let go of the job (restore takes its lock)."""

        async def run() -> None:
            try:
                await self.restore(job_id, "", why)
            except (StalwartError, RpcError) as exc:
                log.error("no agreed checkpoint to go back to", job=job_id, error=str(exc))

        if self._restoring is None or self._restoring.done():
            self._restoring = asyncio.create_task(run())

    async def _record_saved(self, manifest: common.CheckpointManifest, seconds: float) -> int:
        c = self.c
        taken = await c.io(c.state.checkpoint_count, manifest.job_id) + 1
        async with c.lock:
            c.require_leader()
            await c.io(c.state.put_checkpoint_count, c.epoch, manifest.job_id, taken)
            ratio = manifest.written_bytes / manifest.total_bytes if manifest.total_bytes else 0.0
            c.events.add(EV.EVENT_KIND_CHECKPOINT_SAVED,
                         f"checkpoint {manifest.checkpoint_id} of {manifest.job_id} at step "
                         f"{manifest.step}: wrote {manifest.written_bytes} of {manifest.total_bytes} "
                         f"bytes ({ratio:.1%}) in {seconds:.2f}s",
                         job_id=manifest.job_id, step=manifest.step,
                         checkpoint=manifest.checkpoint_id)  # fmt: skip
            await c._flush()
        log.info("checkpoint saved", job=manifest.job_id, checkpoint=manifest.checkpoint_id,
                 step=manifest.step, written=manifest.written_bytes, total=manifest.total_bytes)  # fmt: skip
        return taken

    async def _after_save(self, manifest: common.CheckpointManifest, taken: int) -> None:
        """Retention, then the durable tier; failures here never undo the checkpoint."""
        others = [j for j in self.c.jobs if j != manifest.job_id]
        try:
            await self._io(
                lambda: ckpt.apply_retention(
                    self.store(), manifest.job_id, self.settings.keep_checkpoints, live_jobs=others
                )
            )
        except StalwartError as exc:
            log.warning("checkpoint retention failed", job=manifest.job_id, error=str(exc))
        if self.tier.due(taken):
            try:
                durable = self.pool.get(self.settings.durable_url)
                await self._io(ckpt.copy_checkpoint, self.store(), durable, manifest)
                log.info("checkpoint copied to the durable tier",
                         checkpoint=manifest.checkpoint_id, url=durable.url)  # fmt: skip
            except StalwartError as exc:
                log.warning("durable tier copy failed", checkpoint=manifest.checkpoint_id,
                            error=str(exc))  # fmt: skip

    # --- restoring ------------------------------------------------------------------

    def restore_lost_groups(self) -> None:
        """Start restoring the jobs of lost shard groups once new replicas answer polls."""
        if not self.c.lost_groups or (self._restoring is not None and not self._restoring.done()):
            return
        ready = [k for k in sorted(self.c.lost_groups) if ckptplan.restore_target(self.group_of(k))]
        if ready:
            self._restoring = asyncio.create_task(self._restore_lost(ready))

    async def _restore_lost(self, shards: Sequence[int]) -> None:
        """Restore every job of the lost groups. The groups stay lost until each job is
        restored (or failed: committed steps and no verified checkpoint), so one that
        failed is tried again at the next round; before, the first job restored cleared
        the groups and a second whose restore failed was never tried again, and a job
        without a checkpoint listed first held back every job after it."""
        affected = sorted(
            j.job_id
            for j in self.c.live_jobs.values()
            if not j.finished and any(k < j.num_shards for k in shards)
            and j.job_id not in self._restored_after_loss
        )  # fmt: skip
        why = f"every replica of shard group(s) {list(shards)} lost"
        waiting = False
        for job_id in affected:
            try:
                await self.restore(job_id, "", why, clear_lost=False)
                self._restored_after_loss.add(job_id)
            except (StalwartError, RpcError) as exc:
                if not await self._unrestorable(job_id, exc, why):
                    log.warning("restore after loss failed; retrying", job=job_id, error=str(exc))
                    waiting = True
        if waiting:
            return
        self._restored_after_loss.clear()
        async with self.c.lock:
            for shard in shards:
                if shard in self.c.lost_groups:
                    self.c.lost_groups.discard(shard)
                    self.c._dirty_groups.add(shard)
            await self.c._flush()

    async def _unrestorable(self, job_id: str, exc: Exception, why: str) -> bool:
        """A job the loss left nothing to restore from: none of its steps committed
        (its trainers register it afresh), or no verified checkpoint (failed: its
        committed steps existed only on the lost replicas). True when it was either."""
        if getattr(exc, "kind", None) is not ErrorKind.FAILED_PRECONDITION:
            return False
        async with self.c.lock:
            job = self.c.jobs.get(job_id)
            if job is None or job.finished:
                return True
            if not isinstance(exc, NoVerifiedCheckpoint):
                return False
            if job.step > 0:
                self.c.require_leader()
                self.c._advance(job, jobs.Fail(f"{why} and no verified checkpoint"), time.time())
                self.c._reconcile(time.time())
                await self.c._flush()
            return True

    async def restore(
        self, job_id: str, checkpoint_id: str, why: str, clear_lost: bool = True
    ) -> jobs.Job:
        """Load a checkpoint (by id, or the newest verified) into every shard group;
        ``clear_lost``: its groups are no longer lost (the restore of the lost groups'
        jobs clears them once every job of them is restored)."""
        async with self._restore_lock, self._job_lock(job_id):
            async with self.c.lock:
                job = self.c.job(job_id)
                if job.finished:
                    raise StalwartError(
                        ErrorKind.FAILED_PRECONDITION,
                        f"job {job_id} is {job.state.value}: only active jobs are restored",
                    )
            manifest = await self._choose(job_id, checkpoint_id)
            async with self.c.lock:
                self.c.require_leader()
                plan = []
                for shard in range(job.num_shards):
                    target = ckptplan.restore_target(self.group_of(shard),
                                                     self.c.groups.get(shard, ("", 0))[1])  # fmt: skip
                    if target is None:
                        raise StalwartError(ErrorKind.UNAVAILABLE,
                                            f"shard group {shard} has no live replica to restore on")  # fmt: skip
                    epoch = self.c.hand_out_epoch(shard, target.epoch)
                    plan.append((shard, dataclasses.replace(target, epoch=epoch)))
            for _, t in plan:
                # the new epoch fences the lost group's clients and replicas and
                # changes the shard map, which is what makes trainers start over
                await promote_with_backups(self._call, t.address, t.epoch, t.backups,
                                           self.c.epoch, 10.0)  # fmt: skip
            loaded = await asyncio.gather(*(
                self._call(t.address, "LoadCheckpoint", paramserver.LoadCheckpointRequest(
                    job_id=job_id, store_url=manifest.store_url or self.url, manifest=manifest,
                    epoch=t.epoch, shard=shard,
                ), self.settings.checkpoint_timeout_seconds)
                for shard, t in plan
            ))  # fmt: skip
            async with self.c.lock:
                self.c.require_leader()
                now = time.time()
                for shard, t in plan:
                    self.c.groups[shard] = (t.node_id, t.epoch)
                    if clear_lost:
                        self.c.lost_groups.discard(shard)
                    self.c._dirty_groups.add(shard)
                self.c.restore_generation += 1
                self.c._advance(job, jobs.Rewind(manifest.step), now)
                self.c._dirty_jobs.add(job_id)
                # the marks count from here again
                self._marks[job_id] = _Marks(last_saved=manifest.step)
                self.c.events.add(EV.EVENT_KIND_CHECKPOINT_RESTORED,
                                  f"job {job_id} restored from {manifest.checkpoint_id} at step "
                                  f"{manifest.step} ({why}); "
                                  f"{sum(r.bytes_read for r in loaded)} bytes read",
                                  job_id=job_id, step=manifest.step,
                                  checkpoint=manifest.checkpoint_id)  # fmt: skip
                await self.c._flush()
            log.warning("job restored from checkpoint", job=job_id,
                        checkpoint=manifest.checkpoint_id, step=manifest.step, why=why)  # fmt: skip
            return job

    async def _choose(self, job_id: str, checkpoint_id: str) -> common.CheckpointManifest:
        if checkpoint_id:
            manifest = await self.find(checkpoint_id)
            if manifest.job_id != job_id:
                raise StalwartError(ErrorKind.INVALID_ARGUMENT,
                                    f"checkpoint {checkpoint_id} is of job {manifest.job_id}")  # fmt: skip
            report = await self.verify(manifest)
            if not report.ok:
                ckpt.CORRUPT_CHECKPOINTS.inc()
                raise StalwartError(ErrorKind.DATA_LOSS,
                                    f"checkpoint {checkpoint_id} is corrupt: {report.problems[0]}")  # fmt: skip
            return manifest
        choice = await self._io(ckpt.choose_newest_verified, self.store(), job_id)
        if choice.skipped:
            async with self.c.lock:
                for skipped, reason in choice.skipped:
                    self.c.events.add(EV.EVENT_KIND_CORRUPTION_DETECTED,
                                      f"checkpoint {skipped} skipped: {reason}",
                                      job_id=job_id, checkpoint=skipped)  # fmt: skip
                await self.c._flush()
        if choice.manifest is None:
            raise NoVerifiedCheckpoint(ErrorKind.FAILED_PRECONDITION,
                                       f"job {job_id} has no verified checkpoint in {self.url}")  # fmt: skip
        return choice.manifest

    # --- calls ----------------------------------------------------------------------

    async def _call(self, address: str, method: str, request, timeout: float):
        try:
            return await getattr(self.stub_for(address), method)(request, timeout=timeout)
        except grpc.RpcError as exc:
            raise RpcError.from_grpc(exc) from None
