"""The store prefix is part of the leader Lease's object name on Kubernetes: what it
becomes there, and a prefix that makes no valid name refused when the coordinator
starts (not by every election round after, as an unreachable store would be)."""

from __future__ import annotations

import asyncio

import pytest

from services.coordinator.__main__ import _open_leases
from services.coordinator.statestore import StateStore
from stalwart.server import ConfigError
from stalwart.stores.k8s_lease import object_name


@pytest.mark.parametrize(
    ("store_prefix", "lease_object"),
    [
        ("", "stalwart-coordinator-leader"),
        ("team-a", "stalwart-team-a-coordinator-leader"),
        ("Team_A", "stalwart-team-a-coordinator-leader"),  # the same Lease as "team-a"
        ("runs/2026.12", "stalwart-runs-2026-12-coordinator-leader"),
    ],
)
def test_the_store_prefix_is_in_the_lease_object_name(store_prefix, lease_object) -> None:
    assert object_name("stalwart", StateStore(None, store_prefix).lease_name) == lease_object


def test_a_prefix_too_long_for_a_lease_object_is_refused_at_start() -> None:
    lease_name = StateStore(None, "p" * 181).lease_name  # 200 characters: a valid store key
    with pytest.raises(ConfigError, match="maps to no valid object name"):
        asyncio.run(_open_leases("k8s://stalwart/" + "u" * 63, lease_name))  # 264 > 253
