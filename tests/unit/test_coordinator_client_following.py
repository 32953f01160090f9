"""How CoordinatorClient moves between replicas after a failed call (no network)."""

from __future__ import annotations

import grpc

from stalwart.client.coordinator import CoordinatorClient
from stalwart.errors import RpcError

STANDBY, LEADER, THIRD = "127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"


def not_leader(hint: str = "") -> RpcError:
    metadata = {"leader": hint} if hint else {}
    return RpcError(grpc.StatusCode.FAILED_PRECONDITION, "standby", "NOT_LEADER", metadata)


def unavailable() -> RpcError:
    return RpcError(grpc.StatusCode.UNAVAILABLE, "connection refused")


def test_not_leader_goes_to_the_hinted_leader():
    client = CoordinatorClient([STANDBY, LEADER, THIRD])
    client._next_address(STANDBY, not_leader(LEADER))
    assert client.leader == LEADER


def test_two_calls_refused_by_the_same_standby_both_end_at_the_leader():
    # Both were sent to the standby before either answer came back. The second
    # answer must not move the client on from the leader the first one found.
    client = CoordinatorClient([STANDBY, LEADER])
    client._next_address(STANDBY, not_leader(LEADER))
    client._next_address(STANDBY, not_leader(LEADER))
    assert client.leader == LEADER


def test_a_late_failure_from_an_old_address_leaves_the_leader_alone():
    client = CoordinatorClient([STANDBY, LEADER, THIRD])
    client.leader = LEADER
    client._next_address(STANDBY, unavailable())
    client._next_address(THIRD, not_leader())
    assert client.leader == LEADER


def test_without_a_hint_the_next_replica_is_tried_in_turn():
    client = CoordinatorClient([STANDBY, LEADER, THIRD])
    seen = []
    for _ in range(4):
        client._next_address(client.leader, unavailable())
        seen.append(client.leader)
    assert seen == [LEADER, THIRD, STANDBY, LEADER]


def test_a_hint_outside_the_list_is_followed_and_then_left_in_turn():
    elsewhere = "10.0.0.9:7000"
    client = CoordinatorClient([STANDBY, LEADER])
    client._next_address(STANDBY, not_leader(elsewhere))
    assert client.leader == elsewhere
    client._next_address(elsewhere, unavailable())
    assert client.leader == STANDBY
