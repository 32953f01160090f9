"""The coordinator's recovery clock (events in, recoveries out) and an election whose
lease lives in another backend than the state (k8s:// beside a shm:// store)."""

from __future__ import annotations

import asyncio

import pytest

from services.coordinator.election import Election
from services.coordinator.leader import LeaderState, Role
from services.coordinator.metrics import (
    Quarantined,
    Recovered,
    RecoveryClock,
    counted,
    quarantine_reason,
)
from services.coordinator.settings import CoordinatorSettings
from services.coordinator.statestore import StateStore
from stalwart.api import common
from stalwart.stores import open_store
from stalwart.stores.k8s_lease import K8sLeases
from tests.unit.stores.test_k8s_lease import FakeLeaseAPI

EV = common


def event(kind, t, job_id="", node_id="", message="", **attributes):
    e = common.Event(kind=kind, job_id=job_id, node_id=node_id, message=message,
                     attributes={k: str(v) for k, v in attributes.items()})  # fmt: skip
    e.time.seconds, e.time.nanos = int(t), int(round((t % 1) * 1e9))
    return e


def run(clock: RecoveryClock, *events):
    return list(clock.feed(events))


def test_standby_replacement_lasts_from_death_to_the_next_commit():
    c = RecoveryClock()
    run(c, event(EV.EVENT_KIND_SLOT_ASSIGNED, 10, "j", "t1", slot=0),
        event(EV.EVENT_KIND_SLOT_ASSIGNED, 10, "j", "s1", slot=-1))  # fmt: skip
    assert run(c, event(EV.EVENT_KIND_NODE_DEAD, 20, node_id="t1")) == []
    assert run(c, event(EV.EVENT_KIND_STANDBY_PROMOTED, 20.5, "j", "s1", slot=0)) == []
    out = run(c, event(EV.EVENT_KIND_STEP_COMMITTED, 22.0, "j", step=7))
    assert out == [Recovered("trainer_replaced", pytest.approx(2.0))]
    assert run(c, event(EV.EVENT_KIND_STEP_COMMITTED, 23.0, "j", step=8)) == []  # once


def test_first_assignment_is_no_recovery_but_a_dead_holders_slot_is():
    c = RecoveryClock()
    run(c, event(EV.EVENT_KIND_SLOT_ASSIGNED, 1, "j", "t1", slot=0))
    assert run(c, event(EV.EVENT_KIND_STEP_COMMITTED, 2, "j")) == []
    run(c, event(EV.EVENT_KIND_NODE_DEAD, 3, node_id="t1"),
        event(EV.EVENT_KIND_SLOT_ASSIGNED, 5, "j", "t2", slot=0))  # fmt: skip
    assert run(c, event(EV.EVENT_KIND_STEP_COMMITTED, 6, "j")) == [
        Recovered("trainer_replaced", pytest.approx(3.0))
    ]


def test_promotion_restore_drain_and_quarantine():
    c = RecoveryClock()
    run(c, event(EV.EVENT_KIND_NODE_DEAD, 100, node_id="ps-a"))
    assert run(
        c, event(EV.EVENT_KIND_REPLICA_PROMOTED, 101.5, node_id="ps-b", previous="ps-a")
    ) == [Recovered("replica_promoted", pytest.approx(1.5))]
    # the recorded primary promoted again above a stray's epoch is no recovery
    assert run(c, event(EV.EVENT_KIND_REPLICA_PROMOTED, 102, node_id="ps-b", previous="ps-b")) == []
    run(c, event(EV.EVENT_KIND_NODE_DEAD, 200, "j", shard=0))  # a whole group lost
    assert run(c, event(EV.EVENT_KIND_CHECKPOINT_RESTORED, 204, "j")) == [
        Recovered("checkpoint_restored", pytest.approx(4.0))
    ]
    c.drain_started("t9", 300.0)
    assert run(c, event(EV.EVENT_KIND_NODE_DRAINED, 302, node_id="t9")) == [
        Recovered("node_drained", pytest.approx(2.0))
    ]
    assert run(
        c,
        event(
            EV.EVENT_KIND_NODE_QUARANTINED,
            400,
            node_id="t3",
            message="node t3 quarantined: duplicate compute disagreed",
        ),
    ) == [  # fmt: skip
        Quarantined("duplicate_compute")
    ]


@pytest.mark.parametrize(
    ("text", "reason"),
    [("ABFT checksum mismatch", "abft"), ("replica_fingerprint", "fingerprint"),
     ("chunk CRC32C", "crc"), ("non-finite gradient", "nonfinite"), ("?", "other")],
)  # fmt: skip
def test_quarantine_reasons_are_a_closed_set(text, reason):
    assert quarantine_reason(text) == reason


def test_election_takes_the_lease_from_its_own_backend(tmp_path):
    store = open_store(f"shm://{tmp_path}/state")
    state = StateStore(store)
    settings = CoordinatorSettings(store_url=f"shm://{tmp_path}/state")
    api = FakeLeaseAPI()
    elected: list[int] = []

    async def on_elected(epoch: int) -> None:
        await asyncio.to_thread(state.take_over, epoch)  # what Control.take_over fences with
        elected.append(epoch)

    def make() -> Election:
        leader = LeaderState(settings.leader_ttl_seconds, settings.leader_margin_seconds)
        return Election(state, leader, "c@127.0.0.1:1", settings, on_elected, lambda: None,
                        leases=K8sLeases(api, "stalwart"))  # fmt: skip

    first, second = make(), make()

    async def scenario() -> None:
        await first._try_acquire()
        await second._try_acquire()  # held in the Lease object: refused

    asyncio.run(scenario())
    assert first.leader.role is Role.LEADER and second.leader.role is Role.FOLLOWER
    assert elected == [1] and state.stored_epoch() == 1
    assert list(api.objects) == ["stalwart-coordinator-leader"]
    assert store.get_lease(state.lease_name) is None  # the state store's lease is untouched
    store.close()


def test_a_takeover_above_the_first_epoch_is_a_recovery_timed_elsewhere():
    c = RecoveryClock()
    first = event(EV.EVENT_KIND_LEADER_ELECTED, 1.0, epoch=1)
    second = event(EV.EVENT_KIND_LEADER_ELECTED, 5.0, epoch=2)
    assert run(c, first) == []  # the store's first leader replaced nobody
    assert run(c, second) == [Recovered("leader_elected", None)]


def test_recovery_counts_add_to_the_stored_ones():
    stored = {"leader_elected": 2, "node_drained": 1}
    found = [Recovered("leader_elected", None), Recovered("trainer_replaced", 1.0),
             Quarantined("crc"), Recovered("trainer_replaced", 2.0)]  # fmt: skip
    assert counted(stored, found) == {"leader_elected": 3, "node_drained": 1,
                                      "trainer_replaced": 2}  # fmt: skip
    assert stored == {"leader_elected": 2, "node_drained": 1}  # a new dict: the old one stays
