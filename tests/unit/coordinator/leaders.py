"""A coordinator's control state, just elected over a store, for tests that drive it
directly (no gRPC, no election loop)."""

from __future__ import annotations

import asyncio
import time

from services.coordinator.control import Control
from services.coordinator.leader import LeaderState
from services.coordinator.settings import CoordinatorSettings
from services.coordinator.statestore import StateStore
from stalwart.stores import open_store


def holding_lease(url: str, epoch: int) -> Control:
    """A coordinator over the store at ``url`` that holds the leader lease at ``epoch``
    and has not taken over yet (``await control.take_over(epoch)`` does)."""
    settings = CoordinatorSettings(store_url=url)
    leader = LeaderState(settings.leader_ttl_seconds, settings.leader_margin_seconds)
    leader.acquired(epoch, f"c{epoch}@127.0.0.1:{epoch}", time.monotonic() + 3600)
    return Control(settings, StateStore(open_store(url), "t"), leader)


def elected(url: str, epoch: int) -> Control:
    """A coordinator that has just been elected at ``epoch`` over the store at ``url``
    (outside an event loop)."""
    control = holding_lease(url, epoch)
    asyncio.run(control.take_over(epoch))
    return control
