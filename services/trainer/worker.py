"""The training loop of one trainer: follow the current assignment, step by step.

Sync mode (docs/control-plane.md): the step to compute is always the
paramserver version. Holding slot k, the worker pulls version v, computes step
v for slot k, pushes it with key (job, v, k) and base_version v, and waits for
the step to commit (the push returns once every slot has pushed). Holding
several slots (elastic: fewer live trainers than slots), it computes them one
after another from the same weights, each pushed under its own key as soon as
it is ready, exactly what separate trainers would push. A warm standby only
pulls, so that taking over a slot costs no transfer. ASYNC and SSP jobs push
each slot's own count of pushes instead, from the newest weights
(:meth:`Worker._step_unsynced`).

Pulls are read-only, so they are abandoned the moment the assignment changes;
a computed step is always pushed to the end (graceful stop finishes the step).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import structlog
import torch

from services.trainer import joberrors, phases
from services.trainer.evaluation import Evaluator
from services.trainer.faults import Faults
from services.trainer.telemetry import StepStats
from stalwart import abft, schedule, sdc, training, usererrors
from stalwart.api import common, coordinator
from stalwart.client.paramserver import ParamServerClient
from stalwart.errors import ErrorKind, RpcError, StalwartError
from stalwart.models import Task, resolve
from stalwart.offload import off_loop, tensor_bytes

logger = structlog.get_logger(__name__)

ClientFactory = Callable[[coordinator.GetShardMapResponse], ParamServerClient]
# (job id, step, slot, grads) -> push it? Set when the coordinator samples duplicate compute.
Gate = Callable[[str, int, int, dict], Awaitable[bool]]
ABFT_RETRIES = 2  # recomputations after an ABFT mismatch before the step fails
PUSH_CHECK_S = 0.2  # how often a pending push looks for a moved shard map
# A step whose pushes wait this long is logged once, with the primaries they wait
# on: a rare multi-second stall is otherwise invisible in the trainer's log.
SLOW_PUSH_LOG_S = 2.0
RETRY_PAUSE_S = 0.2  # between attempts after an error that needs no backoff of its own
USER_ERROR_PAUSE_S = 1.0  # before retrying a step whose user code raised
# A warm standby refreshes its weights at most this often, not at every version: it
# must not load the primary with a fourth pull per step. Taking over a slot pulls the
# newest version anyway (one delta pull, milliseconds on the workloads measured).
STANDBY_REFRESH_S = 1.0


def slots_of(a: coordinator.Assignment) -> tuple[int, ...]:
    """The slots an assignment gives, ascending; none for a standby (a coordinator
    that predates ``slots`` names just ``slot``)."""
    if a.standby:
        return ()
    return tuple(sorted(a.slots)) if a.slots else (a.slot,)


def _shape(a: coordinator.Assignment | None) -> tuple | None:
    """What identifies an assignment's work (the step field only says where it stood)."""
    if a is None:
        return None
    return (a.job_id, slots_of(a), a.standby, a.shard_map.SerializeToString(deterministic=True))


# a compute shorter than this last time runs on the event loop (computes_inline)
INLINE_COMPUTE_S = 0.02
# Modes whose pushes are applied on arrival, each slot counting its own steps.
UNSYNCED = (common.CONSISTENCY_MODE_ASYNC, common.CONSISTENCY_MODE_SSP)
# A step no slot reaches: pushed once to learn a slot's count from the refusal.
PROBE_STEP = 1 << 62


@dataclass
class JobState:
    """The job the worker holds weights of."""

    job_id: str
    spec: coordinator.JobSpec
    task: Task
    model: torch.nn.Module
    client: ParamServerClient
    shard_map: bytes
    version: int = -1  # version of the weights in the model; -1: none yet
    # The version last loaded into the model. Unlike ``version`` it is kept when the
    # shard map changes: it says what the model holds, not what to pull next.
    weights_version: int = -1
    next_version: int = 0  # version to wait for before the next step
    # A step committed on some shard groups only, which this trainer finishes for
    # every slot (_finishes_lagging_step); None when no group lags.
    lagging_step: int | None = None
    finished: bool = False
    registered: bool = False  # RegisterModel answered through the current client
    prefetched: bool = False  # the model holds the version the last push committed
    # a pull that outlasted one wait of :meth:`Worker._pull` and goes on (a large
    # model's transfer): (the version it waits for, its task), taken up by the next call
    pull_under_way: tuple[int, asyncio.Future] | None = None
    last_compute_s: float | None = None  # how long the last slot's compute took
    # async and ssp: per slot held, the step its next push carries (the count of its
    # pushes applied); learnt from the paramserver when the slot is first pushed
    clocks: dict[int, int] = field(default_factory=dict)

    def keep_clocks_of(self, slots) -> None:
        """Forget the step of each slot no longer held. Kept, a slot that came back
        after another trainer pushed for it long enough (past the paramserver's
        dedupe window) pushed its old steps, each answered as a duplicate and thrown
        away, one step at a time; under SSP the slot's real count stood still."""
        for slot in [k for k in self.clocks if k not in slots]:
            del self.clocks[slot]


class Worker:
    def __init__(
        self, device: str, make_client: ClientFactory, faults: Faults, poll_s: float = 5.0
    ):
        self.device = device
        self.make_client = make_client
        self.faults = faults
        self.poll_s = poll_s
        self.stats = StepStats()
        self.desired: coordinator.Assignment | None = None
        self.job: JobState | None = None
        self.current: coordinator.Assignment | None = None
        self.changed = asyncio.Event()
        self.stopping = False
        self.finished_jobs: set[str] = set()
        self.on_step: Callable[[int], None] | None = None
        self.on_finished: Callable[[str], None] | None = None
        self.gate: Gate | None = None  # duplicate-compute verdicts (services/trainer/dupcheck.py)
        # (kind, job id, step, message) from the compute's thread (the executor's or
        # the loop's): report corruption caught here
        self.on_corruption: Callable[[str, str, int, str], None] | None = None
        # (job id, error) when the job's own code raised: reported to the coordinator
        self.on_user_error: Callable[[str, usererrors.UserCodeError], Awaitable[None]] | None = None
        self.abft_stats = abft.AbftStats()
        self.evaluator = Evaluator(device)  # JobSpec.eval_every (services/trainer/evaluation.py)

    # --- control ------------------------------------------------------------------

    def assign(self, assignment: coordinator.Assignment | None) -> None:
        """Take a new assignment (or none); the loop switches at the next safe point."""
        if _shape(assignment) != _shape(self.desired):
            logger.info(
                "assignment changed",
                job=assignment.job_id if assignment else "",
                slots=list(slots_of(assignment)) if assignment else [],
                standby=assignment.standby if assignment else False,
            )
            self.desired = assignment
            self.changed.set()

    def request_stop(self) -> None:
        self.stopping = True
        self.changed.set()

    # --- the loop -------------------------------------------------------------------

    async def run(self) -> None:
        try:
            while not self.stopping:
                self.changed.clear()
                assignment = self.desired
                if assignment is None or assignment.job_id in self.finished_jobs:
                    self.current = assignment
                    await self._wait_changed(self.poll_s)
                    continue
                await self._attempt(assignment)
        finally:
            await self._drop_job()

    async def _attempt(self, assignment: coordinator.Assignment) -> None:
        try:
            if not await self._hold(assignment):
                return
            self.current = assignment
            if assignment.standby:
                await self._follow()
            elif assignment.spec.consistency.mode in UNSYNCED:
                await self._step_unsynced(slots_of(assignment))
            else:
                await self._step(slots_of(assignment))
        except StalwartError as err:
            if err.kind is not ErrorKind.INVALID_ARGUMENT:
                await self._on_error(err)
            else:  # the spec asks what cannot be done here (init_from unreadable...)
                await self._on_user_error(
                    assignment, joberrors.cannot_run(err, slots_of(assignment))
                )
        except RpcError as err:
            await self._on_error(err)
        except usererrors.UserCodeError as err:
            await self._on_user_error(assignment, err)

    async def _on_user_error(
        self, assignment: coordinator.Assignment, err: usererrors.UserCodeError
    ) -> None:
        """The job's own code raised: this trainer stays up, reports it and retries the
        step (the coordinator fails the job when the error repeats); a model that does
        not even import is never retried."""
        logger.error("user code failed", job=assignment.job_id, phase=err.phase, slot=err.slot,
                     step=err.step, error_type=err.error_type, error=err.message,
                     location=err.location)  # fmt: skip
        # a model that does not import here will not on a retry, unless this machine's
        # device or memory was at fault (the leader then drains this trainer)
        if err.phase == usererrors.IMPORT and not usererrors.machine_fault(
            err.error_type, err.message
        ):
            self.finished_jobs.add(assignment.job_id)
        if self.on_user_error is not None:
            try:
                await self.on_user_error(assignment.job_id, err)
            except (RpcError, StalwartError) as report_err:
                logger.warning("user error report failed", error=str(report_err))
        await self._wait_changed(USER_ERROR_PAUSE_S)

    async def _on_error(self, err: RpcError | StalwartError) -> None:
        if err.kind is ErrorKind.UNKNOWN_JOB and self.job is not None:
            self.job.registered = False  # the paramservers lost it: register again
        logger.warning("step failed; retrying", error=str(err), kind=err.kind.reason)
        await self._wait_changed(RETRY_PAUSE_S)

    async def _wait_changed(self, timeout: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.changed.wait(), timeout)
            return True
        return False

    # --- holding a job's weights ---------------------------------------------------

    async def _hold(self, assignment: coordinator.Assignment) -> bool:
        """Make sure the model and client are those of the assignment's job; False if
        the assignment changed before the model was registered."""
        shard_map = assignment.shard_map.SerializeToString(deterministic=True)
        job = self.job
        if job is None or job.job_id != assignment.job_id:
            await self._drop_job()
            self.job = job = await asyncio.get_running_loop().run_in_executor(
                None, self._build_job, assignment, shard_map
            )
        elif job.shard_map != shard_map:
            await _close_client(job)
            job.client, job.shard_map = self.make_client(assignment.shard_map), shard_map
            job.registered = False
            # New primaries (a promotion, or a restore from a checkpoint that
            # rewound the version): follow whatever version they hold. A step
            # pushed already and pulled again is recomputed and answered as a
            # duplicate, so forgetting costs a full pull, never a double update.
            job.version, job.next_version, job.prefetched = -1, 0, False
        if not job.registered:
            try:
                registered = await self._unless_changed(self._register(job))
            except RpcError as err:
                if err.kind is not ErrorKind.LIMIT_EXCEEDED:
                    raise
                raise joberrors.too_large(err, slots_of(assignment)) from None
            if not registered:
                return False
        return True

    async def _unless_changed(self, work: Awaitable) -> bool:
        """Await ``work``; False (and ``work`` cancelled) if the assignment changes first.

        A registration sent to a shard group whose every replica was lost retries
        for a minute; the restore that brings the group back elsewhere changes the
        shard map, and the registration must go there at once."""
        task = asyncio.ensure_future(work)
        changed = asyncio.ensure_future(self.changed.wait())
        try:
            await asyncio.wait({task, changed}, return_when="FIRST_COMPLETED")
        finally:
            changed.cancel()
        if task.done():
            task.result()
            return True
        await _abandon(task)
        return False

    def _build_job(self, assignment: coordinator.Assignment, shard_map: bytes) -> JobState:
        spec = assignment.spec
        with usererrors.user_code(usererrors.IMPORT):
            try:
                task = resolve(spec)
            except StalwartError as err:  # cannot import it, or not a task: the job's error
                raise usererrors.UserCodeError(
                    usererrors.IMPORT, "ModelError", err.message
                ) from None
            joberrors.check_room(task, spec, slots_of(assignment))
            model = task.build_model(spec.seed).to(self.device)
        if spec.abft:  # checksums only read the layers' values: gradients stay bitwise equal
            self.abft_stats, _ = abft.protect(model)
        # One throwaway gradient (slot 0, step 0; nothing is pushed, the weights are
        # untouched) pays the first-step costs now: loading the dataset (digits-cnn
        # imports scikit-learn) and autograd's start-up took ~5 s on two busy cores,
        # which a warm standby promoted into a slot would otherwise add to recovery.
        # A local-SGD job warms up with one inner step: H of them would only cost time.
        with usererrors.user_code(usererrors.STEP, slot=0, step=0):
            training.compute_step(task, model, 0, 0, training.one_inner_step(spec))
        client = self.make_client(assignment.shard_map)
        return JobState(assignment.job_id, spec, task, model, client, shard_map)

    async def _register(self, job: JobState) -> None:
        """Idempotent RegisterModel with the seeded initial weights: the first one wins."""
        initial = training.initial_state(job.task, job.spec)
        s = job.spec
        # resolved as on admission, for specs that never passed a coordinator (file mode)
        rule = schedule.resolved(s.optimizer, s.steps)
        await job.client.register_model(
            job.job_id, initial, rule, s.consistency, max(s.num_slots, 1),
            buffers=training.buffer_names(job.task, s.seed), gradient_dtype=s.gradient_dtype,
        )  # fmt: skip
        job.registered = True

    async def _drop_job(self) -> None:
        if self.job is not None:
            await _close_client(self.job)
            self.job = None

    # --- pulling ----------------------------------------------------------------------

    async def _pull(self, min_version: int, started: asyncio.Future | None = None) -> bool:
        """Bring the model to ``min_version`` or later; False if the assignment changed first.
        ``started``: a pull already under way (the prefetch of :meth:`_step`)."""
        job = self.job
        pull = started or await _pull_taken_up(job, min_version)
        pull = pull or asyncio.ensure_future(self._pull_consistent(job, min_version))
        changed = asyncio.ensure_future(self.changed.wait())
        try:
            await asyncio.wait({pull, changed}, timeout=self.poll_s, return_when="FIRST_COMPLETED")
        except BaseException:
            await _abandon(pull)  # read-only: safe to abandon
            raise
        finally:
            changed.cancel()
        if not pull.done():
            if self.changed.is_set() or self.stopping:
                await _abandon(pull)
            else:
                # Still under way after poll_s: the caller looks at its assignment and
                # comes back for it. Started again, a model whose transfer takes longer
                # than poll_s was never loaded at all.
                job.pull_under_way = (min_version, pull)
            return False
        if pull.cancelled():
            return False
        return pull.result()

    async def _pull_consistent(self, job: JobState, min_version: int, timed: bool = True) -> bool:
        """Pull until every shard group reports the same version (>= min_version)."""
        started = time.perf_counter()
        while True:
            versions, tensors = await job.client.pull(job.job_id, job.version, min_version)
            if min(versions) == max(versions):
                break
            if _finishes_lagging_step(job, versions):
                return True
            min_version = max(versions)  # a commit landed on some groups only: catch up
        await self._load(job, versions[0], tensors, started if timed else None)
        return True

    async def _load(
        self, job: JobState, version: int, tensors: dict, started: float | None = None
    ) -> None:
        """Load pulled tensors of ``version`` into the model (``started``: when the pull
        began, for the step timeline's pull phase)."""
        pulled = time.perf_counter()
        await off_loop(
            training.load_params, job.model, tensors, nbytes=tensor_bytes(tensors.values())
        )
        if started is not None and self.current is not None and not self.current.standby:
            phases.observe("pull", started)
            phases.PHASE_SECONDS.labels("load").observe(time.perf_counter() - pulled)
        job.version = job.weights_version = version
        job.next_version = max(job.next_version, job.version)
        if job.version >= job.spec.steps:
            job.finished = True
            self.finished_jobs.add(job.job_id)
            logger.info("job finished", job=job.job_id, version=job.version)
            if self.on_finished is not None:
                self.on_finished(job.job_id)

    async def _follow(self) -> None:
        """Standby: keep the weights current without computing."""
        if await self._pull(self.job.version + 1):
            await self._wait_changed(STANDBY_REFRESH_S)

    # --- computing a step --------------------------------------------------------------

    async def _step(self, slots: tuple[int, ...]) -> None:
        """Compute the step for every slot held, one after another from the same weights;
        each slot's push goes out as soon as its gradient is ready, then all wait for
        the commit together (the step commits only once every slot has pushed). A step
        some shard groups lag behind on is pushed for every slot (_slots_to_push)."""
        job = self.job
        fresh, job.prefetched = job.prefetched, False
        if not fresh and not await self._pull(job.next_version):
            return
        await self.evaluator.between_steps(job, slots)
        if job.finished:
            return
        step, started = job.version, time.monotonic()
        to_push = _slots_to_push(job, slots, step)
        results: list[training.StepResult] = []
        pushes: list[asyncio.Future] = []
        prefetch: asyncio.Future | None = None
        pushed = False
        # A model that fits in a push's answer comes back in the first slot's answers
        # (no pull call at all); a larger one is pulled as below.
        carry = job.client.answers_carry_parameters
        try:
            for slot in to_push:
                result = await self._computed(job, slot, step, pushing=bool(pushes))
                if result is None:
                    await self._wait_changed(RETRY_PAUSE_S)  # dropped: quarantine moves the slot
                    return
                results.append(result)
                pushes.append(asyncio.ensure_future(job.client.push(
                    job.job_id, step, slot, step, result.grads, result.loss,
                    answer_parameters=carry and not pushes,
                )))  # fmt: skip
            # Otherwise the next version's pull goes out with the pushes: the primary
            # holds it until the step commits and streams it at once, so no round trip
            # follows the ack. Not sooner: it must not load new weights under a computation.
            if not carry:
                prefetch = asyncio.ensure_future(self._pull_consistent(job, step + 1, timed=False))
            pushing = time.perf_counter()
            pushed = await self._answered(
                job, to_push, dict(zip(to_push, pushes, strict=True)), step=step
            )
        finally:
            if not pushed:  # failed or abandoned: drop the pushes and the read-only pull
                for task in [*pushes, *([prefetch] if prefetch else [])]:
                    await _abandon(task)
        if not pushed:
            return
        phases.observe("push", pushing)
        acked = time.perf_counter()
        self.faults.after_push(step)
        job.next_version = step + 1
        own = [r for slot, r in zip(to_push, results, strict=True) if slot in slots]
        self._record(step, time.monotonic() - started, own)
        logger.debug("step pushed", job=job.job_id, step=step, slots=list(to_push))
        if carry:
            loaded = await self._load_carried(job, step + 1, pushes[0].result())
        else:
            loaded = await self._pull(step + 1, started=prefetch)
        if loaded and job.version == step + 1:
            job.prefetched = True
            phases.observe("pull", acked)  # from the ack until the next weights are loaded
            await self.evaluator.between_steps(job, slots)  # the final version's, too

    async def _step_unsynced(self, slots: tuple[int, ...]) -> None:
        """ASYNC and SSP (docs/paramserver.md): from the newest weights, each slot held
        computes and pushes its next step, applied on arrival. A slot's step is its
        own count of applied pushes, which picks its batch; SSP's paramserver holds a
        push while the slot leads the slowest by more than the staleness."""
        job = self.job
        job.keep_clocks_of(slots)
        if not await self._pull(max(job.version, 0)):
            return
        await self.evaluator.between_steps(job, slots)
        if job.finished:
            return
        base, started = job.version, time.monotonic()
        results: list[training.StepResult] = []
        pushes: dict[int, tuple[int, asyncio.Future]] = {}
        try:
            # The slot furthest behind first, and all pushes at once: under SSP a
            # leading slot's push waits for the others this trainer also holds.
            for slot in sorted(slots, key=lambda k: job.clocks.get(k, -1)):
                step = job.clocks.get(slot, 0)
                result = await self._computed(job, slot, step, pushing=bool(pushes))
                if result is None:
                    await self._wait_changed(RETRY_PAUSE_S)
                    return
                if slot not in job.clocks:  # a slot taken over part-way: learn where it is
                    job.clocks[slot] = await self._slot_clock(job, slot, step, result)
                    if job.clocks[slot] != step:
                        return  # computed for another step: start again from fresh weights
                results.append(result)
                push = job.client.push(job.job_id, step, slot, base, result.grads, result.loss)
                pushes[slot] = (step, asyncio.ensure_future(push))
            answers = {slot: push for slot, (_, push) in pushes.items()}
            if not await self._answered(job, slots, answers):
                return
            for slot, (step, push) in pushes.items():
                self._pushed_unsynced(job, slot, step, push)
        finally:
            for _, push in pushes.values():
                await _abandon(push)  # applied once or not at all; a lost one is relearnt
        self._record(base, time.monotonic() - started, results)

    def _pushed_unsynced(self, job: JobState, slot: int, step: int, push: asyncio.Future) -> None:
        """Move the slot's clock on past an answered push, or raise how it failed."""
        try:
            _raise_failed(job, step, slot, push)  # answered already (_answered)
        except RpcError as err:
            if err.kind in (ErrorKind.INVALID_ARGUMENT, ErrorKind.CONFLICTING_PUSH):
                job.clocks.pop(slot, None)  # another holder pushed for the slot: relearn
            raise
        job.clocks[slot] = step + 1

    async def _slot_clock(
        self, job: JobState, slot: int, step: int, result: training.StepResult
    ) -> int:
        """The step ``slot`` pushes next, from the paramserver's refusal of a step
        none reaches (an ordinary push's bytes, so nothing else is refused first, but
        for bytes no push may carry: NaN or Inf, the job's own error, as for ``step``
        it was computed for)."""
        try:
            await job.client.push(job.job_id, PROBE_STEP, slot, job.version, result.grads)
        except RpcError as err:
            expected = err.metadata.get("expected_step", "")
            if err.kind is ErrorKind.INVALID_ARGUMENT and expected.isdigit():
                return int(expected)
            if err.kind is ErrorKind.NON_FINITE:
                raise joberrors.not_finite(job.model, step, slot) from None
            raise
        raise StalwartError(ErrorKind.INTERNAL, f"step {PROBE_STEP} of slot {slot} was accepted")

    async def _load_carried(self, job: JobState, version: int, results) -> bool:
        """Load the weights one push's answers carried; pull ``version`` instead when
        some group's answer carried none (too large, or not yet readable there) or
        the groups' versions differ."""
        carried = job.client.carried(results)
        if carried is None or min(carried[0]) != max(carried[0]):
            return await self._pull(version)
        await self._load(job, carried[0][0], carried[1])
        return True

    async def _computed(
        self, job: JobState, slot: int, step: int, pushing: bool = False
    ) -> training.StepResult | None:
        """One slot's result for ``step``; None when duplicate compute outvoted it.
        ``pushing``: a push of this step is in flight (another slot's)."""
        computing = time.perf_counter()
        if computes_inline(job.last_compute_s, self.faults, pushing=pushing):
            result = self._compute(job, slot, step)
        else:
            result = await asyncio.get_running_loop().run_in_executor(
                None, self._compute, job, slot, step
            )
        job.last_compute_s = time.perf_counter() - computing
        phases.observe("compute", computing)
        if not await self._confirmed(job, step, slot, result.grads):
            return None
        return result

    def _record(self, step: int, seconds: float, results: list[training.StepResult]) -> None:
        """One row per step, whatever the slots: their mean loss and gradient norm."""
        n = len(results)
        loss = sum(r.loss for r in results) / n
        norm = sum(r.grad_norm() for r in results) / n
        self.stats.record(step, seconds, loss, norm, sum(r.examples for r in results))
        if self.on_step is not None:
            self.on_step(step)

    async def _answered(
        self, job: JobState, slots: tuple[int, ...], pushes: dict[int, asyncio.Future],
        step: int | None = None,
    ) -> bool:  # fmt: skip
        """Wait for every push (``{slot: push}``) to be answered, unless meanwhile the
        job's shard groups moved where these pushes cannot follow
        (_followed_by_old_client) or the trainer was given a slot more (False: the
        step starts over). ``slots``: the slots the trainer holds or pushes for.

        A push to a group that is gone (every replica lost, then restored
        elsewhere from a checkpoint) would only retry until its SDK gives up; a
        step waiting on a slot this trainer now holds would wait for ever (an SSP
        push held for a slot that lost its trainer waits for the push this
        trainer now makes). Pushes are keyed by (job, step, slot), so abandoning
        one is safe: it was applied once or not at all, and the next attempt
        pulls again (a slot pushed already is answered as a duplicate).

        ``step``: the synchronous step all the pushes are for; a failed push then
        ends the wait at once (the asynchronous modes look at each push's answer
        afterwards, slot by slot)."""
        pending, since, logged = set(pushes.values()), time.monotonic(), False
        while pending:
            done, pending = await self._some_answered(pending)
            if pending and not logged and time.monotonic() - since > SLOW_PUSH_LOG_S:
                logged = True
                logger.warning("step waiting on its pushes", job=job.job_id, step=step,
                               slots=[k for k, p in pushes.items() if p in pending],
                               seconds=round(time.monotonic() - since, 1),
                               primaries=job.client.primaries())  # fmt: skip
            if step is not None:
                for slot, push in pushes.items():
                    if push in done:
                        _raise_failed(job, step, slot, push)
            why = self._follow_or_give_up(job, slots) if pending else None
            if why is not None:
                logger.warning(f"pushes abandoned: {why}", job=job.job_id, slots=list(slots))
                return False
        return True

    async def _some_answered(self, pending: set[asyncio.Future]) -> tuple[set, set]:
        """(done, pending) once a push ends, the assignment changes, or PUSH_CHECK_S
        passes. A new assignment is how a moved shard map arrives, so the pushes are
        looked at again at once: waiting for the next check added up to PUSH_CHECK_S
        to the recovery from a lost paramserver primary."""
        changed = None
        if not self.changed.is_set():  # set already: the checks alone pace the wait
            changed = asyncio.ensure_future(self.changed.wait())
        try:
            await asyncio.wait(
                pending | ({changed} if changed else set()),
                timeout=PUSH_CHECK_S, return_when="FIRST_COMPLETED",
            )  # fmt: skip
        finally:
            if changed is not None:
                changed.cancel()
        done = {p for p in pending if p.done()}
        return done, pending - done

    def _follow_or_give_up(self, job: JobState, slots: tuple[int, ...]) -> str | None:
        """Send the pending pushes after a promoted backup where they can follow it
        (ParamServerClient.follow), and say why they cannot end well, or None. A slot
        taken away (the slots spread out, a drain) is pushed to the end all the same."""
        desired = self.desired
        if desired is None or desired.job_id != job.job_id:
            return None
        moved = desired.shard_map.SerializeToString(deterministic=True) != job.shard_map
        if moved and not _followed_by_old_client(job.shard_map, desired.shard_map):
            return "the shard groups moved"
        if moved:  # a promoted backup: the calls under way go to it now
            job.client.follow(desired.shard_map.groups)
        if not set(slots_of(desired)) <= set(slots):
            return "given another slot, which the step waits for"
        return None

    async def _confirmed(self, job: JobState, step: int, slot: int, grads) -> bool:
        """Sampled batches wait for the duplicate-compute verdict before they are pushed."""
        rate = job.spec.duplicate_compute_rate
        if self.gate is None or not sdc.is_sampled(job.job_id, job.spec.seed, step, slot, rate):
            return True
        return await self.gate(job.job_id, step, slot, grads)

    def _compute(self, job: JobState, slot: int, step: int) -> training.StepResult:
        # on the loop or in the executor (computes_inline); heartbeats go out from a
        # thread of their own either way (services/trainer/sources.py)
        result = self._compute_checked(job, slot, step)
        self.faults.corrupt(step, result.grads)
        self.faults.before_push(step)
        return result

    def _compute_checked(self, job: JobState, slot: int, step: int) -> training.StepResult:
        """compute_step; an ABFT mismatch drops the result, is reported, and is recomputed."""
        for attempt in range(ABFT_RETRIES + 1):
            try:
                with usererrors.user_code(usererrors.STEP, slot=slot, step=step):
                    self.faults.in_compute(step)
                    return training.compute_step(job.task, job.model, slot, step, job.spec)
            except abft.AbftError as err:
                sdc.DETECTIONS.labels("abft").inc()
                logger.error("ABFT mismatch: result dropped", step=step, attempt=attempt,
                             error=err.message)  # fmt: skip
                if self.on_corruption is not None:
                    self.on_corruption("abft", job.job_id, step, err.message)
                if attempt == ABFT_RETRIES:
                    raise


async def _close_client(job: JobState) -> None:
    """Close the job's client, a pull still under way on it first: taken up by the
    next wait, that pull retried on the closed client (on replicas a restore had
    replaced) instead of starting over on the new one."""
    if job.pull_under_way is not None:
        await _abandon(job.pull_under_way[1])
        job.pull_under_way = None
    await job.client.close()


def _raise_failed(job: JobState, step: int, slot: int, push: asyncio.Future) -> None:
    """Raise the error a finished push ended with; non-finite gradients as the job's own."""
    try:
        push.result()
    except RpcError as err:
        if err.kind is ErrorKind.NON_FINITE:
            raise joberrors.not_finite(job.model, step, slot) from None
        raise


def _finishes_lagging_step(job: JobState, versions: list[int]) -> bool:
    """Whether this trainer can finish the step some shard groups still wait for.

    A step can commit on some groups only: a primary lost while its slots' pushes
    were arriving, before any reached its backup. The promoted backup waits for
    that step's pushes again, and no version the groups agree on comes until it
    gets them. A model that still holds the lagging groups' version (the base of
    that step on every group) computes the step once more; groups where it
    committed answer the same bytes as duplicates. Its ``version`` is set to that
    base, so the step starts from it; nothing is loaded.
    """
    lagging = min(versions)
    if job.weights_version != lagging:
        return False
    job.version = job.next_version = job.lagging_step = lagging
    return True


def _slots_to_push(job: JobState, held: tuple[int, ...], step: int) -> tuple[int, ...]:
    """The slots whose ``step`` this trainer computes and pushes: those it holds, and
    when it finishes a lagging step (``_finishes_lagging_step``) every other slot
    too, after its own. A slot's trainer may hold no weights of that step's base (a
    fresh process in its place): if only each slot's holder pushed, the lagging group
    would wait for that slot for good. Gradients are bitwise the same whoever computes
    them, so groups that have the push already answer duplicates."""
    if job.lagging_step != step:
        return held
    job.lagging_step = None
    others = [k for k in range(max(job.spec.num_slots, 1)) if k not in held]
    return (*held, *others)


def _followed_by_old_client(old_map: bytes, new: coordinator.GetShardMapResponse) -> bool:
    """Whether pushes under way on the old shard map's client can still end well on
    the new map: one shard group, the same pieces, and a primary the old client
    knows already (a promoted backup), which its own failover finds by epoch.
    Abandoning them threw away a step the new primary was about to commit and
    added a pull, a compute and a push to the recovery. With several groups a
    step may have committed on some only, and every trainer starts over from
    what each group holds (_finishes_lagging_step), so those pushes are dropped."""
    old = coordinator.GetShardMapResponse.FromString(old_map)
    if len(new.groups) != 1 or len(old.groups) != 1 or old.shard_map != new.shard_map:
        return False
    was, now = old.groups[0], new.groups[0]
    known = (was.primary_address, *was.backup_addresses)
    return bool(now.primary_address) and now.primary_address in known


async def _pull_taken_up(job: JobState, min_version: int) -> asyncio.Future | None:
    """The pull left under way for ``min_version`` (abandoned if it waits for another)."""
    under_way, job.pull_under_way = job.pull_under_way, None
    if under_way is None:
        return None
    version, pull = under_way
    if version == min_version and not pull.cancelled():
        return pull
    await _abandon(pull)
    return None


async def _abandon(task: asyncio.Future) -> None:
    """Cancel a pull and wait for it to stop (it must not load weights later)."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, RpcError, StalwartError):
        await task


def computes_inline(last_compute_s: float | None, faults: Faults, pushing: bool) -> bool:
    """Whether a slot's compute runs on the event loop instead of the executor.

    The hop to an executor thread and back costs the loop about 0.8 ms, a fifth or
    more of a short CPU step (docs/performance.md, lever 18), so a compute whose
    previous one took under INLINE_COMPUTE_S runs inline. Not the first of a job
    (its first autograd step is slow, and nothing is known yet), not while another
    slot's push of the step is in flight (it would stall behind the compute), and
    not with a test fault that sleeps or hangs in it (chaos tests stop such a
    trainer with SIGTERM, which a loop stuck in a compute would not see). Heartbeats
    never wait for it: they have a thread of their own.
    """
    if last_compute_s is None or pushing or faults.sleeps:
        return False
    return last_compute_s < INLINE_COMPUTE_S
