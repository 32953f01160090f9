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


def elected(url: str, epoch: int) -> Control:
    """A coordinator that has just been elected at ``epoch`` over the store at ``url``."""
    settings = CoordinatorSettings(store_url=url)
    leader = LeaderState(settings.leader_ttl_seconds, settings.leader_margin_seconds)
    leader.acquired(epoch, f"c{epoch}@127.0.0.1:{epoch}", time.monotonic() + 3600)
    control = Control(settings, StateStore(open_store(url), "t"), leader)
    asyncio.run(control.take_over(epoch))
    return control
