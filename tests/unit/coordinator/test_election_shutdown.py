"""A leader-lease acquire still running when its wait ends (SIGTERM, store timeout):
the thread cannot be stopped, so the lease it still gets must be given back at
once, not left held by a replica that does not act on it (every standby would
wait a whole TTL). A real shm:// store; only the acquire waits for a gate."""

from __future__ import annotations

import asyncio
import threading

from services.coordinator.__main__ import _hand_over
from services.coordinator.election import Election
from services.coordinator.leader import LeaderState, Role
from services.coordinator.settings import CoordinatorSettings
from services.coordinator.statestore import StateStore
from stalwart.stores import Lease, Store, open_store
from tests.helpers import assert_eventually_async

GATE_S = 30.0  # bounds on waits that end at once unless something is broken


class GatedLeases:
    """A store's leases whose acquire waits for ``gate`` (a slow store round trip)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.returned = threading.Event()
        self.acquired: list[Lease | None] = []

    def acquire_lease(self, name: str, holder: str, ttl_s: float) -> Lease | None:
        self.entered.set()
        if not self.gate.wait(GATE_S):
            raise AssertionError("the gate was never opened")
        lease = self.store.acquire_lease(name, holder, ttl_s)
        self.acquired.append(lease)
        self.returned.set()
        return lease

    def renew_lease(self, lease: Lease) -> bool:
        return self.store.renew_lease(lease)

    def release_lease(self, lease: Lease) -> bool:
        return self.store.release_lease(lease)

    def get_lease(self, name: str) -> Lease | None:
        return self.store.get_lease(name)


def _election(tmp_path, **settings_kw) -> tuple[Election, GatedLeases, list[int]]:
    url = f"shm://{tmp_path}/state"
    store = open_store(url)
    state = StateStore(store, "t")
    # A long TTL: a lease left held would stay held for the whole test.
    settings = CoordinatorSettings(store_url=url, leader_ttl_seconds=60.0, **settings_kw)
    leases = GatedLeases(store)
    elected: list[int] = []

    async def on_elected(epoch: int) -> None:
        elected.append(epoch)

    leader = LeaderState(settings.leader_ttl_seconds, settings.leader_margin_seconds)
    election = Election(state, leader, "c1@127.0.0.1:1", settings, on_elected, lambda: None,
                        leases=leases)  # fmt: skip
    return election, leases, elected


def _free_for_a_standby(election: Election, leases: GatedLeases) -> None:
    name = election.state.lease_name
    assert leases.store.get_lease(name) is None
    standby = leases.store.acquire_lease(name, "c2@127.0.0.1:2", 60.0)
    assert standby is not None and standby.holder == "c2@127.0.0.1:2"


def test_sigterm_while_acquiring_leaves_the_lease_free(tmp_path):
    election, leases, elected = _election(tmp_path, store_timeout_seconds=GATE_S)

    async def scenario() -> None:
        loop = asyncio.create_task(election.run())
        assert await asyncio.to_thread(leases.entered.wait, GATE_S)  # acquire in flight
        hook = asyncio.create_task(_hand_over(election))  # what SIGTERM runs
        await asyncio.sleep(0)  # the hook has begun
        leases.gate.set()  # ... and only now does the store grant the lease
        await asyncio.wait_for(hook, GATE_S)
        loop.cancel()  # then the process cancels its loops and exits
        await asyncio.gather(loop, return_exceptions=True)

    asyncio.run(scenario())
    assert leases.acquired[0] is not None  # the acquire did get the lease ...
    assert elected == [] and election.leader.role is Role.FOLLOWER  # ... never acted on
    assert election.lease is None
    _free_for_a_standby(election, leases)  # ... and gave it back before exiting
    leases.store.close()


def test_shutdown_stops_the_election_loop(tmp_path):
    election, leases, _elected = _election(tmp_path, store_timeout_seconds=GATE_S)
    leases.gate.set()

    async def leading() -> bool:
        return election.leader.role is Role.LEADER

    async def scenario() -> None:
        loop = asyncio.create_task(election.run())
        await assert_eventually_async(leading, timeout=GATE_S)
        await _hand_over(election)
        await asyncio.wait_for(loop, GATE_S)  # ends by itself: no cancel needed

    asyncio.run(scenario())
    assert election.leader.role is Role.FOLLOWER and election.lease is None
    _free_for_a_standby(election, leases)
    leases.store.close()


def test_an_acquire_that_outlives_its_timeout_gives_the_lease_back(tmp_path):
    election, leases, elected = _election(tmp_path, store_timeout_seconds=0.2)
    name = election.state.lease_name

    async def scenario() -> None:
        await election._try_acquire()  # the wait gives up; the thread is still at the gate
        assert election.leader.role is Role.FOLLOWER
        leases.gate.set()
        assert await asyncio.to_thread(leases.returned.wait, GATE_S)
        # well within the 60 s TTL that a kept lease would block standbys for
        await assert_eventually_async(
            lambda: asyncio.to_thread(lambda: leases.store.get_lease(name) is None),
            timeout=20.0,
        )

    asyncio.run(scenario())
    assert leases.acquired[0] is not None and elected == []
    _free_for_a_standby(election, leases)
    leases.store.close()
