"""The jobs one replica holds, and what both the gRPC servicer and checkpointing
do to them: epoch checks, installing state on backups, replacing a job's state,
and executing a commit's actions (:mod:`services.paramserver.commit`).

Imports neither the servicer nor checkpointing: both import this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from services.paramserver import budget, commit, metrics, phases
from services.paramserver.faults import Faults
from services.paramserver.job import Entry, JobModel
from services.paramserver.replica import Check, ReplicaState
from services.paramserver.replicator import Fenced, Replicator
from stalwart import codec
from stalwart.api import paramserver
from stalwart.errors import ErrorKind, StalwartError
from stalwart.offload import off_loop

log = structlog.get_logger(__name__)

CHECK_ERRORS = {
    Check.STALE_EPOCH: (ErrorKind.STALE_EPOCH, "epoch {got} is older than this replica's {have}"),
    Check.NOT_PRIMARY: (ErrorKind.NOT_PRIMARY, "this replica is a backup; call the primary"),
    Check.FENCED: (ErrorKind.FENCED, "this replica was deposed at epoch {have}; refresh"),
    Check.UNKNOWN_EPOCH: (
        ErrorKind.UNKNOWN_EPOCH,
        "epoch {got} is newer than this replica's {have} and no coordinator configured it "
        "here; refresh the shard map",
    ),
    Check.OLD_COORDINATOR: (
        ErrorKind.STALE_EPOCH,
        "this order comes from an older coordinator leader than the last one obeyed "
        "(coordinator epoch {coordinator}); ask the current leader",
    ),
}


@dataclass
class JobRuntime:
    """A job's model plus what serialises access to it and who waits on it."""

    model: JobModel
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    committed: asyncio.Condition = field(init=False)
    # on a backup: a push was staged (a commit may be waiting for it)
    staged: asyncio.Condition = field(init=False)
    # on a primary: (step, slot) -> the forward of that push to the backups (the
    # backups' answers) and the backups it went to, while its handler runs
    forwarding: dict[tuple[int, int], tuple[asyncio.Future, frozenset[str]]] = field(
        default_factory=dict
    )
    # on a primary forwarding sums (JobModel.forwards_sums): (step, slot) -> the
    # header of that staged push, without its tensors, named in the sum's forward
    summed_pushes: dict[tuple[int, int], paramserver.PushHeader] = field(default_factory=dict)
    step_done: dict[int, asyncio.Future] = field(default_factory=dict)
    pull_cache: tuple | None = None  # (version, names, chunk size, header, chunks)
    # GetFingerprint(at_version) callers, answered when a commit reaches that version
    fingerprint_at: dict[int, asyncio.Future] = field(default_factory=dict)
    # how many callers wait for each mark: one nobody waits for any more is dropped
    # (a caller asking for versions far ahead, then giving up, piled them up)
    fingerprint_waiting: dict[int, int] = field(default_factory=dict)
    # taken from a RegisterModel here (initial weights): its installs say so, and a
    # backup that holds the job further along refuses them
    fresh: bool = False

    def __post_init__(self) -> None:
        self.committed = asyncio.Condition(self.lock)
        self.staged = asyncio.Condition(self.lock)

    def future_for(self, step: int) -> asyncio.Future:
        fut = self.step_done.get(step)
        if fut is None or fut.done():
            fut = self.step_done[step] = asyncio.get_running_loop().create_future()
            # the committing push may be the only one that ever looks at it
            fut.add_done_callback(lambda f: f.cancelled() or f.exception())
        return fut

    def fingerprint_mark(self, version: int) -> asyncio.Future:
        """The mark a caller waits on for ``version``; give it back with
        :meth:`release_fingerprint_mark` when done waiting, answered or not."""
        fut = self.fingerprint_at.get(version)
        if fut is None:
            fut = self.fingerprint_at[version] = asyncio.get_running_loop().create_future()
            fut.add_done_callback(lambda f: f.cancelled() or f.exception())
        self.fingerprint_waiting[version] = self.fingerprint_waiting.get(version, 0) + 1
        return fut

    def release_fingerprint_mark(self, version: int, mark: asyncio.Future) -> None:
        left = self.fingerprint_waiting.get(version, 1) - 1
        if left > 0:
            self.fingerprint_waiting[version] = left
            return
        self.fingerprint_waiting.pop(version, None)
        if self.fingerprint_at.get(version) is mark:
            del self.fingerprint_at[version]  # unanswered, and nobody waits for it

    async def settle_fingerprints(self) -> None:
        """Answer the marks this version reaches or passes (caller holds the lock).

        Taken here, inside the commit's critical section, each replica
        fingerprints exactly the same version whatever the timing of the calls.
        """
        version = self.model.version
        for at in sorted(v for v in self.fingerprint_at if v <= version):
            fut = self.fingerprint_at.pop(at)
            if at == version:
                prints = await off_loop(self.model.fingerprints)
                if not fut.done():
                    fut.set_result(prints)
            elif not fut.done():
                passed = f"version {at} was never held here (went to {version})"
                fut.set_exception(StalwartError(ErrorKind.FAILED_PRECONDITION, passed))

    def fail_waiters(self, error: StalwartError) -> None:
        """Pushes waiting for a step of a state that was replaced can never commit."""
        for fut in self.step_done.values():
            if not fut.done():
                fut.set_exception(error)
        self.step_done.clear()


@dataclass
class JobHost:
    """This replica's jobs with its role, its replication, and the settings both
    the servicer and checkpointing answer by."""

    replica: ReplicaState
    replicator: Replicator
    shard: int
    limits: codec.Limits
    sync_wait_s: float
    on_role_change: Callable = lambda role: None
    faults: Faults = field(default_factory=Faults)
    jobs: dict[str, JobRuntime] = field(default_factory=dict)
    memory_budget: int = 0  # bytes for every job's state; 0: what is free (budget.py)

    # --- checks ------------------------------------------------------------------

    def check_room(self, header: paramserver.ModelHeader) -> None:
        """Refuse a job this replica has no memory for, before a byte of its state is
        read: a model registered here, or a whole job a primary installs (a backup
        with a smaller budget than its primary's, or a hostile install, would be
        allocated until the OOM killer took every job). The job's own state, when
        held, is replaced and so not counted."""
        held = (job.model.header for job_id, job in self.jobs.items() if job_id != header.job_id)
        budget.check_room(header, budget.room(self.memory_budget, held))

    def raise_check(self, check: Check, got: int) -> None:
        if check is Check.OK:
            return
        if check is Check.FENCED:
            self.on_role_change(self.replica.role)
        kind, text = CHECK_ERRORS[check]
        text = text.format(
            got=got, have=self.replica.epoch, coordinator=self.replica.coordinator_epoch
        )
        raise StalwartError(kind, text, epoch=self.replica.epoch)

    def check_client(self, epoch: int) -> None:
        self.raise_check(self.replica.check_client(epoch), epoch)

    def job(self, job_id: str) -> JobRuntime:
        job = self.jobs.get(job_id)
        if job is None:
            raise StalwartError(
                ErrorKind.UNKNOWN_JOB, f"no model registered for job {job_id!r}", job=job_id
            )
        return job

    def fenced(self, reason: object) -> StalwartError:
        self.on_role_change(self.replica.role)
        return StalwartError(ErrorKind.FENCED, f"a backup refused this primary's epoch: {reason}")

    # --- installing state ----------------------------------------------------------

    async def install_everywhere(self, job: JobRuntime) -> None:
        """Make sure enough backups hold the job (caller holds the job's lock)."""
        job_id = job.model.job_id
        for address in self.replica.backups:
            if address not in self.replicator.synced(job_id):
                await self.install(job, address)
        if not self.replicator.holds_enough(job_id):
            raise StalwartError(
                ErrorKind.NO_INSYNC_BACKUP, f"no backup could take job {job_id}; retry"
            )

    async def install(self, job: JobRuntime, address: str) -> None:
        """Install the job's state on one backup (caller holds the job's lock)."""
        header = job.model.install_header(self.replica.epoch, job.fresh)
        tensors = list(job.model.state_tensors().values())
        try:
            await self.replicator.install(address, header, tensors)
        except Fenced as exc:
            raise self.fenced(exc) from None
        job.committed.notify_all()  # pulls and pushes wait for backups in sync

    async def replace(self, model: JobModel, why: str) -> JobRuntime:
        """Make ``model`` the job's state here and on the backups (a restore)."""
        job = self.jobs.get(model.job_id)
        if job is None:
            job = self.jobs[model.job_id] = JobRuntime(model)
        async with job.lock:
            job.model = model
            job.fresh = False  # a checkpoint's state: the backups take it, lower or not
            job.pull_cache = None
            job.fail_waiters(StalwartError(ErrorKind.TOO_STALE, f"{why}; pull"))
            await job.settle_fingerprints()
            job.committed.notify_all()
            for address in list(self.replica.backups):
                self.replicator.drop(address, model.job_id, why)
            await self.install_everywhere(job)
        return job

    async def applied(self, job: JobRuntime) -> None:
        """After the job's state changed (caller holds its lock)."""
        self.faults.after_apply(job.model)
        await job.settle_fingerprints()

    # --- committing ----------------------------------------------------------------

    async def commit(self, job: JobRuntime, entries: list[Entry]) -> int:
        """Run one :class:`commit.CommitRound` (caller holds the job's lock): commit on
        the in-sync backups and here at once, and answer the step's waiters.

        The round runs to its outcome even when the call that started it is cancelled
        (its client gave up or died), and the call holds the lock until then. Cut
        short, the round left its apply running in a thread after the lock was
        released, the step's other pushes waiting until their deadline, and backups
        whose commit was cancelled still counted as holding the step."""
        round_ = asyncio.ensure_future(self._commit_round(job, entries))
        try:
            return await asyncio.shield(round_)
        except asyncio.CancelledError:
            # Every wait in a round has a timeout (the backups' acknowledgement), so
            # this ends; the bound is for a wedged one (the server is stopping under it).
            deadline = time.monotonic() + self.sync_wait_s
            while not round_.done() and time.monotonic() < deadline:
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait({round_}, timeout=deadline - time.monotonic())
            if not round_.done():
                round_.cancel()
            elif not round_.cancelled():
                round_.exception()  # its outcome is the waiters'; retrieved, not raised
            raise

    async def _commit_round(self, job: JobRuntime, entries: list[Entry]) -> int:
        if self.faults.at_commit:  # tests only
            await self.faults.before_commit(job.model)
        job_id, base, step = job.model.job_id, job.model.version, entries[0].step
        waiter = job.future_for(step)
        if job.model.forwards_sums:
            records = [await self._forward_sum(job, entries)]
        else:
            records = [job.forwarding[k] for k in ((e.step, e.slot) for e in entries)
                       if k in job.forwarding]  # fmt: skip
        targets = tuple(self.replicator.synced(job_id))
        # a backup synced after one of these pushes was forwarded never got it
        unforwarded = frozenset(a for a in targets for _, sent in records if a not in sent)
        round_ = commit.CommitRound(base, targets, self.replicator.required(), unforwarded)
        request = self.replicator.commit_request(job_id, base, entries)
        if self.faults.commit_across_promotion_at_version is not None:  # tests only
            await self.faults.before_sending_commit(job.model, lambda: self.replica.epoch)
        started = time.perf_counter()
        tasks: dict[asyncio.Future, str | type] = {}

        def spawn(action) -> None:
            if isinstance(action, commit.AwaitForwards):
                forwards = [fut for fut, _ in records]
                tasks[asyncio.ensure_future(_forwards_ended(forwards))] = commit.ForwardsEnded
            elif isinstance(action, commit.Apply):
                work = phases.timed("apply", off_loop(job.model.apply, entries))
                tasks[asyncio.ensure_future(work)] = commit.Apply
            elif isinstance(action, commit.AskEpoch):
                work = self.replicator.epoch_of(action.address)
                tasks[asyncio.ensure_future(work)] = (commit.AskEpoch, action.address)
            else:
                work = self.replicator.commit_one(action.address, request)
                tasks[asyncio.ensure_future(work)] = action.address

        for action in round_.start():
            if isinstance(action, commit.Drop):
                self.replicator.drop(action.address, job_id, action.reason)
            else:
                spawn(action)
        backups_left = len(round_.targets) - len(round_.answered)
        if not backups_left:
            phases.observe("replicate", started)
        try:
            while tasks:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    source = tasks.pop(task)
                    if source is commit.ForwardsEnded:
                        event = task.result()
                    elif source is commit.Apply:
                        event = _apply_event(task)
                    elif isinstance(source, tuple):  # (AskEpoch, the backup asked)
                        event = commit.EpochAnswered(source[1], task.result())
                    else:
                        event = self.replicator.commit_event(source, task.result())
                        if isinstance(event, commit.BackupAcked):
                            self.replicator.acked[(source, job_id)] = base + 1
                        backups_left -= 1
                        if not backups_left:
                            phases.observe("replicate", started)
                            metrics.REPLICATION_SECONDS.observe(time.perf_counter() - started)
                    for action in round_.feed(event, self.replica.epoch):
                        if isinstance(action, commit.Apply | commit.AskEpoch):
                            spawn(action)
                            continue
                        result = await self._execute(job, action, step, waiter)
                        if result is not None:
                            return result
        finally:
            for task in tasks:
                task.cancel()
        raise AssertionError("a commit round ended without an outcome")  # pragma: no cover

    async def _forward_sum(
        self, job: JobRuntime, entries: list[Entry]
    ) -> tuple[asyncio.Future, frozenset[str]]:
        """Reduce the step's pushes here and start forwarding the sum to the backups
        (one transfer each, instead of every push): the record of that forward.
        The commit applies the very tensors forwarded, after the forward ended."""
        model = job.model
        reduced = await off_loop(model.reduce, entries)
        keys = [(e.step, e.slot) for e in entries]
        model.stage_sum(model.version, keys, reduced)
        tensors = reduced.tensors()
        header = paramserver.PushHeader(
            job_id=model.job_id, step=entries[0].step, slot=entries[0].slot,
            base_version=model.version, tensors=[codec.spec_of(n, t) for n, t in tensors.items()],
            packed=True,
        )  # fmt: skip
        pushes = [job.summed_pushes.pop(k, None) for k in keys]
        summed = [p or paramserver.PushHeader(job_id=model.job_id, step=k[0], slot=k[1])
                  for p, k in zip(pushes, keys, strict=True)]  # fmt: skip
        for key in [k for k in job.summed_pushes if k[0] < entries[0].step]:
            del job.summed_pushes[key]  # of steps that went by without them
        return self.replicator.forward_sum(header, summed, list(tensors.values()))

    async def _execute(
        self, job: JobRuntime, action, step: int, waiter: asyncio.Future
    ) -> int | None:
        """Perform one action of a commit round; the round's outcome returns or raises."""
        if isinstance(action, commit.Drop):
            self.replicator.drop(action.address, job.model.job_id, action.reason)
        elif isinstance(action, commit.Fence):
            self.replica.fence()
        elif isinstance(action, commit.LocalStateChanged):
            await self.applied(job)
            job.committed.notify_all()
        elif isinstance(action, commit.Acknowledge):
            waiter.set_result(action.version)
            job.step_done.pop(step, None)
            return action.version
        else:
            err = _outcome_error(self, job.model.job_id, action)
            waiter.set_exception(err)
            raise err
        return None


async def _forwards_ended(forwards: list[asyncio.Future]) -> commit.ForwardsEnded:
    """Wait for the pushes' forwards (their own handlers await and report them too)."""
    for fut in forwards:
        try:
            await asyncio.shield(fut)
        except Fenced as exc:
            return commit.ForwardsEnded(str(exc))
        except Exception:  # noqa: BLE001 - the push's own handler answers it
            pass
    return commit.ForwardsEnded()


def _apply_event(task: asyncio.Task) -> commit.Applied | commit.ApplyFailed:
    exc = task.exception()
    return commit.ApplyFailed(exc) if exc is not None else commit.Applied(task.result())


def _outcome_error(host: JobHost, job_id: str, action) -> BaseException:
    if isinstance(action, commit.Refuse):
        return StalwartError(
            ErrorKind.NO_INSYNC_BACKUP,
            f"{action.have} of the {action.need} required backups hold job {job_id}; "
            "not acknowledged, retry",
        )
    if action.error is not None:
        return action.error
    return host.fenced(action.reason)
