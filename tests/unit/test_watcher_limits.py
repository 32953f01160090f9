"""Watch streams are bounded: past the limit a new watcher of the coordinator's events
or the health service's alerts is refused LIMIT_EXCEEDED, and a watcher that leaves
makes room. Each one holds a call and a queue, so unbounded ones would exhaust the
server's memory."""

from __future__ import annotations

import asyncio

import pytest

from services.coordinator import events
from services.health import alerts
from stalwart import limits
from stalwart.errors import ErrorKind, StalwartError


@pytest.mark.parametrize("make", [events.EventLog, lambda: alerts.AlertLog(kept=10)])
def test_watchers_past_the_limit_are_refused_until_one_leaves(make, monkeypatch):
    monkeypatch.setattr(limits, "MAX_WATCHERS", 3)

    async def scenario() -> None:
        log = make()
        queues = [log.subscribe() for _ in range(3)]
        with pytest.raises(StalwartError) as refused:
            log.subscribe()
        assert refused.value.kind is ErrorKind.LIMIT_EXCEEDED
        assert "3 " in str(refused.value) and "watchers open already" in str(refused.value)
        log.unsubscribe(queues[0])
        assert log.subscribe() is not None

    asyncio.run(scenario())
