"""The election loop: executes what leader.py decides against the store lease.

A standby tries to acquire ``coordinator/leader`` every poll interval; the
leader renews every renew interval from a thread of its own (not the event
loop, not the shared executor), so nothing a client sends (a huge request, a
burst of calls, slow store I/O of other work) can delay a renewal. Store calls
have a timeout; a renew that fails or comes back too late steps the leader down. Elected and
deposed hooks are awaited in order, so a replica never serves as leader before
it has reloaded the stored state.

An acquire cannot be stopped once its thread has started: a lease it gets after
the wait gave up (timeout, cancellation) or after :meth:`Election.stop` began is
released at once, so no lease is ever held by a replica that does not know it
(every standby would wait a whole TTL for it to lapse).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

import structlog

from services.coordinator.leader import LeaderState, Role
from services.coordinator.metrics import LEADER_CHANGES, leader_elected
from services.coordinator.settings import CoordinatorSettings
from services.coordinator.statestore import StateStore
from stalwart.errors import StalwartError
from stalwart.stores import Lease

log = structlog.get_logger(__name__)


class Leases(Protocol):
    """The lease half of the store contract: every Store has it, and so has
    :class:`stalwart.stores.k8s_lease.K8sLeases` (a lease without a state store)."""

    def acquire_lease(self, name: str, holder: str, ttl_s: float) -> Lease | None: ...
    def renew_lease(self, lease: Lease) -> bool: ...
    def release_lease(self, lease: Lease) -> bool: ...
    def get_lease(self, name: str) -> Lease | None: ...


class Election:
    def __init__(
        self,
        state: StateStore,
        leader: LeaderState,
        holder: str,
        settings: CoordinatorSettings,
        on_elected: Callable[[int], Awaitable[None]],
        on_deposed: Callable[[], None],
        leases: Leases | None = None,
    ) -> None:
        self.state = state
        # The lease may live apart from the state (k8s:// on Kubernetes): the
        # state store is still fenced by the lease's token (StateStore.take_over).
        self.leases: Leases = leases if leases is not None else state.store
        self.leader = leader
        self.holder = holder
        self.settings = settings
        self.on_elected = on_elected
        self.on_deposed = on_deposed
        self.lease: Lease | None = None
        self._hold_off_until = 0.0  # after StepDown: let a standby win the lease
        self._stopping = False  # stop() began: acquire nothing more
        self._acquiring: asyncio.Future[None] | None = None  # store work stop() waits for
        self._wanted: asyncio.Future[None] | None = None  # the call _try_acquire waits on
        self._unclaimed: Lease | None = None  # acquired, not yet taken up by _try_acquire
        self._let_go = threading.Event()  # set to end the renewal thread
        self._renewal: asyncio.Task | None = None  # watches the renewal thread while leading

    async def _io(self, fn, *args):
        return await asyncio.wait_for(
            asyncio.to_thread(fn, *args), self.settings.store_timeout_seconds
        )

    async def run(self) -> None:
        while not self._stopping:
            renewal = self._renewal
            if self.leader.role is Role.LEADER and renewal is not None and not renewal.done():
                await asyncio.wait({renewal})  # until the lease is lost or given up
            elif self.leader.role is Role.LEADER:
                await asyncio.sleep(self.settings.leader_renew_seconds)
            else:
                if time.monotonic() >= self._hold_off_until:
                    await self._try_acquire()
                await asyncio.sleep(self.settings.leader_poll_seconds)

    async def stop(self) -> None:
        """Shutdown (SIGTERM): acquire nothing more, let an acquire in flight end, and
        release whatever lease this replica holds or has just acquired."""
        self._stopping = True
        call = self._acquiring
        if call is not None and not call.done():
            # the call releases a lease it gets from now on; wait for that release
            done, _ = await asyncio.wait({call}, timeout=2 * self.settings.store_timeout_seconds)
            if not done:
                log.warning("a leader lease acquire is still running at shutdown")
        lease, self._unclaimed = self._unclaimed, None
        if lease is not None:  # acquired before stop(), _try_acquire not resumed yet
            await self._give_back(lease, "acquired while shutting down")
        await self.step_down("shutting down")

    async def _try_acquire(self) -> None:
        if self._stopping:
            return
        started = time.monotonic()
        try:
            lease = await self._acquire()
            if lease is None:
                if self._stopping:
                    return
                current = await self._io(self.leases.get_lease, self.state.lease_name)
                if current is not None:
                    self.leader.observed(current.holder, current.token)
                return
        except (StalwartError, TimeoutError) as exc:
            log.warning("cannot reach the store to acquire the leader lease", error=str(exc))
            return
        self.lease = lease
        self.leader.acquired(lease.token, lease.holder, started)
        # renewing starts now, not after the take-over: reloading the state may be slow
        self._let_go.clear()
        self._renewal = asyncio.create_task(self._keep_lease(lease))
        LEADER_CHANGES.inc()
        log.warning("acquired the leader lease", epoch=lease.token)
        try:
            await self.on_elected(lease.token)
        except Exception as exc:  # cannot load state or fenced: give the lease back
            log.exception("taking over failed; stepping down")
            await self.step_down(f"take-over failed: {exc}")
            return
        if self.lease is not lease:  # deposed (stop, StepDown, fenced) during the take-over
            self.on_deposed()  # undo what the take-over set up after the first stand-down
            return
        # from finding the lease free (the old leader's lapsed) to serving the stored state
        leader_elected(lease.token, time.monotonic() - started)

    async def _acquire(self) -> Lease | None:
        """``acquire_lease`` in a thread, waited for up to the store timeout."""
        call = asyncio.ensure_future(self._acquire_call())
        self._acquiring = self._wanted = call
        try:
            await asyncio.wait_for(asyncio.shield(call), self.settings.store_timeout_seconds)
        except BaseException:  # timed out or cancelled: nobody takes up what it gets
            self._wanted = None
            lease, self._unclaimed = self._unclaimed, None
            if lease is not None:  # it had just finished: give its lease back
                self._acquiring = asyncio.ensure_future(self._give_back(lease, "acquire abandoned"))
            raise
        self._wanted = None
        lease, self._unclaimed = self._unclaimed, None
        return lease

    async def _acquire_call(self) -> None:
        """Run one acquire to its end; keep the lease only while someone waits for it."""
        this = asyncio.current_task()
        try:
            lease = await asyncio.to_thread(self.leases.acquire_lease, self.state.lease_name,
                                            self.holder, self.settings.leader_ttl_seconds)  # fmt: skip
        except Exception:
            if self._wanted is this:
                raise
            return  # the wait already gave up and said so
        if lease is None:
            return
        if self._stopping or self._wanted is not this:
            await self._give_back(lease, "acquired after shutdown began or the wait gave up")
        else:
            self._unclaimed = lease

    async def _give_back(self, lease: Lease, why: str) -> None:
        log.warning("releasing a leader lease nobody acts on", epoch=lease.token, why=why)
        try:
            await self._io(self.leases.release_lease, lease)
        except (StalwartError, TimeoutError) as exc:
            log.warning("cannot release the leader lease; it will lapse", error=str(exc))

    async def _keep_lease(self, lease: Lease) -> None:
        """Renew ``lease`` from a dedicated thread until it fails or this replica lets go."""
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[bool | None] = loop.create_future()

        def finish(ok: bool | None) -> None:
            if not ended.done():
                ended.set_result(ok)

        def renew_forever() -> None:
            ok: bool | None = None
            try:
                ok = self._renew_until_change(lease)
            finally:
                with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
                    loop.call_soon_threadsafe(finish, ok)

        thread = threading.Thread(target=renew_forever, name="leader-lease", daemon=True)
        thread.start()
        while not ended.done():
            await asyncio.wait({ended}, timeout=self.settings.leader_renew_seconds)
            if ended.done() or self.lease is not lease or self.leader.acting(time.monotonic()):
                continue
            # the thread is stuck in a store call past the lease: let go, it ends on return
            log.warning("stepping down", epoch=self.leader.epoch, reason="lease renewal stuck")
            self.leader.step_down("lease renewal stuck in the store")
            await self._deposed(release=False)
            return
        ok = ended.result()
        if ok is not None and self.lease is lease:  # the renewal failed: we lost the lease
            await self._deposed(release=ok)

    def _renew_until_change(self, lease: Lease) -> bool | None:
        """Runs in the renewal thread. Returns the last renew's outcome when that
        stepped this replica down, None when it was let go some other way."""
        while not self._let_go.is_set() and self.lease is lease:
            started = time.monotonic()
            try:
                ok = self.leases.renew_lease(lease)
            except Exception as exc:  # a store error: the lease is as good as lost
                log.warning("cannot renew the leader lease", error=str(exc))
                ok = False
            if self._let_go.is_set() or self.lease is not lease:
                return None
            change = self.leader.renewed(ok, started, time.monotonic())
            if change is not None:
                log.warning("stepping down", epoch=change.epoch, reason=change.reason)
                return ok
            self._let_go.wait(self.settings.leader_renew_seconds)
        return None

    async def step_down(self, reason: str, hold_off: bool = False) -> int:
        """Give the lease up at once (StepDown RPC, SIGTERM); returns the epoch held."""
        epoch = self.leader.epoch
        if self.leader.step_down(reason) is None and self.lease is None:
            return epoch  # not leading: nothing to give up
        log.warning("stepping down", epoch=epoch, reason=reason)
        if hold_off:
            self._hold_off_until = time.monotonic() + 2 * self.settings.leader_ttl_seconds
        await self._deposed(release=True)
        return epoch

    async def fenced(self, reason: str) -> None:
        """A newer epoch exists: stop at once (the lease is someone else's)."""
        if self.leader.step_down(reason) is not None:
            await self._deposed(release=False)

    async def _deposed(self, release: bool) -> None:
        self._let_go.set()
        LEADER_CHANGES.inc()
        self.on_deposed()
        lease, self.lease = self.lease, None
        if release and lease is not None:
            try:
                await self._io(self.leases.release_lease, lease)
            except (StalwartError, TimeoutError) as exc:
                log.warning("cannot release the leader lease; it will lapse", error=str(exc))
