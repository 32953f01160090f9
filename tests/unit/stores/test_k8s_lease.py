"""The k8s:// lease logic against an in-memory fake of the Lease API.

The fake behaves like the API server where it matters: create fails on an
existing object, replace fails unless the resourceVersion read is current, and
every write bumps the resourceVersion.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest

from stalwart.errors import StalwartError
from stalwart.stores.k8s_lease import (
    NAME_ANNOTATION,
    TOKEN_ANNOTATION,
    Conflict,
    K8sLeases,
    LeaseObject,
    decide_acquire,
    from_k8s,
    object_name,
    parse_k8s_url,
    to_k8s,
)


class FakeLeaseAPI:
    def __init__(self) -> None:
        self.objects: dict[str, LeaseObject] = {}
        self.version = 0
        self.writes = 0

    def _stamp(self, obj: LeaseObject) -> LeaseObject:
        self.version += 1
        self.writes += 1
        obj = dataclasses.replace(obj, resource_version=str(self.version))
        self.objects[obj.name] = obj
        return obj

    def read(self, name: str) -> LeaseObject | None:
        return self.objects.get(name)

    def create(self, obj: LeaseObject) -> LeaseObject:
        if obj.name in self.objects:
            raise Conflict("exists")
        return self._stamp(obj)

    def replace(self, obj: LeaseObject) -> LeaseObject:
        cur = self.objects.get(obj.name)
        if cur is None or cur.resource_version != obj.resource_version:
            raise Conflict("stale resourceVersion")
        return self._stamp(obj)


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def setup():
    api, clock = FakeLeaseAPI(), Clock()
    a = K8sLeases(api, "stalwart", clock)
    b = K8sLeases(api, "stalwart", clock)  # a second process, its own observations
    return api, clock, a, b


def test_acquire_then_others_refused_while_renewed(setup):
    api, clock, a, b = setup
    lease = a.acquire_lease("coordinator/leader", "c1@h1:1", 2)
    assert lease is not None and lease.token == 1 and lease.holder == "c1@h1:1"
    assert "stalwart-coordinator-leader" in api.objects
    assert b.acquire_lease("coordinator/leader", "c2@h2:1", 2) is None
    assert a.acquire_lease("coordinator/leader", "c1@h1:1", 2) is None  # renew, don't re-take
    for _ in range(5):
        clock.t += 1.5
        assert a.renew_lease(lease)
        assert b.acquire_lease("coordinator/leader", "c2@h2:1", 2) is None
    got = b.get_lease("coordinator/leader")
    assert got is not None and got.holder == "c1@h1:1" and got.token == 1


def test_expiry_is_judged_from_local_observation(setup):
    api, clock, a, b = setup
    lease = a.acquire_lease("coordinator/leader", "c1", 2)
    # b sees the record for the first time now: it must wait a full duration
    # from this moment, whatever renewTime says.
    clock.t += 10
    assert b.acquire_lease("coordinator/leader", "c2", 2) is None
    clock.t += 1.9
    assert b.acquire_lease("coordinator/leader", "c2", 2) is None
    clock.t += 0.2
    taken = b.acquire_lease("coordinator/leader", "c2", 2)
    assert taken is not None and taken.token == 2
    assert api.objects["stalwart-coordinator-leader"].transitions == 1
    # The old holder's renewal fails: it must stop acting.
    assert not a.renew_lease(lease)
    assert not a.release_lease(lease)


def test_holder_stops_when_its_own_deadline_passed(setup):
    _, clock, a, _ = setup
    lease = a.acquire_lease("x", "c1", 1)
    clock.t += 1.0
    assert not a.renew_lease(lease)


def test_release_keeps_token_and_frees_at_once(setup):
    api, _, a, b = setup
    lease = a.acquire_lease("coordinator/leader", "c1", 5)
    assert a.release_lease(lease)
    assert not a.release_lease(lease)
    obj = api.objects["stalwart-coordinator-leader"]
    assert obj.holder == "" and obj.token == 1
    assert b.get_lease("coordinator/leader") is None
    again = b.acquire_lease("coordinator/leader", "c2", 5)
    assert again is not None and again.token == 2


def test_fencing_token_grows_even_for_the_same_holder(setup):
    _, clock, a, _ = setup
    tokens = []
    for _ in range(3):
        lease = a.acquire_lease("l", "c1", 1)
        assert lease is not None
        tokens.append(lease.token)
        clock.t += 1.01
    assert tokens == [1, 2, 3]


def test_a_lost_race_is_a_refusal_not_an_error(setup):
    api, clock, a, b = setup

    class Racy(FakeLeaseAPI):
        def create(self, obj):
            api.create(dataclasses.replace(obj, holder="someone-else"))  # wins first
            return api.create(obj)

        def read(self, name):
            return api.read(name)

    racy = K8sLeases(Racy(), "stalwart", clock)
    assert racy.acquire_lease("l", "c1", 1) is None
    assert api.objects["stalwart-l"].holder == "someone-else"


def test_renew_with_a_stale_token_fails(setup):
    _, clock, a, b = setup
    lease = a.acquire_lease("l", "c1", 1)
    clock.t += 1.5
    b.acquire_lease("l", "c2", 1)  # b has never observed it: waits a duration first
    clock.t += 1.1
    new = b.acquire_lease("l", "c2", 1)
    assert new is not None
    assert not a.renew_lease(lease)


def test_ttl_rounds_up_to_whole_seconds():
    obj = decide_acquire(None, "n", "l", "h", 0.25, 5.0, 5.0)
    assert obj is not None and obj.duration_s == 1 and obj.token == 1


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("k8s://stalwart/stalwart", ("stalwart", "stalwart")),
        ("k8s://ml-prod/ps-a", ("ml-prod", "ps-a")),
    ],
)
def test_parse_url(url, expected):
    assert parse_k8s_url(url) == expected


@pytest.mark.parametrize(
    "url", ["k8s://stalwart", "redis://x/y", "k8s://Bad_NS/x", "k8s://ns/a/b", "k8s:///x"]
)
def test_bad_urls(url):
    with pytest.raises(StalwartError):
        parse_k8s_url(url)


def test_object_names_are_dns_1123():
    assert object_name("stalwart", "coordinator/leader") == "stalwart-coordinator-leader"
    assert object_name("p", "ps/shard-0:primary") == "p-ps-shard-0-primary"
    with pytest.raises(StalwartError):
        object_name("p", "bad name")


def test_body_round_trip_through_the_client_shape():
    obj = LeaseObject("stalwart-l", "c1", 2, 1_700_000_000.5, 1_700_000_000.25, 3, 7, "l", "42")
    body = to_k8s(obj)
    assert body["metadata"]["annotations"] == {TOKEN_ANNOTATION: "7", NAME_ANNOTATION: "l"}
    assert body["metadata"]["resourceVersion"] == "42"
    assert body["spec"]["renewTime"] == "2023-11-14T22:13:20.500000Z"
    # What the kubernetes client hands back: attributes, datetimes.
    as_client = SimpleNamespace(
        metadata=SimpleNamespace(
            name="stalwart-l", resource_version="43", annotations=body["metadata"]["annotations"]
        ),
        spec=SimpleNamespace(
            holder_identity="c1",
            lease_duration_seconds=2,
            renew_time=datetime.fromtimestamp(obj.renew_time, UTC),
            acquire_time=datetime.fromtimestamp(obj.acquire_time, UTC),
            lease_transitions=3,
        ),
    )
    assert from_k8s(as_client) == dataclasses.replace(obj, resource_version="43")
