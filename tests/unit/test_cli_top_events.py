"""`stalwart top --once` reading the event history (stalwart/cli/top.py)."""

import asyncio
import itertools

from stalwart.api import common
from stalwart.cli.top import EVENTS_SHOWN, recent_events


class Endless:
    """A stream that never goes quiet: an event every ``every_s``, as a running job's
    committed steps are."""

    def __init__(self, every_s: float):
        self.every_s = every_s

    async def watch_events(self):
        for sequence in itertools.count(1):
            yield common.Event(sequence=sequence)
            await asyncio.sleep(self.every_s)


class History:
    """A replayed history that then stays quiet."""

    async def watch_events(self):
        for sequence in range(1, 31):
            yield common.Event(sequence=sequence)
        await asyncio.sleep(3600)


def test_a_stream_that_never_goes_quiet_is_read_for_the_limit_only():
    got = asyncio.run(recent_events(Endless(0.01), quiet_s=0.5, limit_s=0.3))
    assert len(got) == EVENTS_SHOWN
    assert [e.sequence for e in got] == list(range(got[0].sequence, got[0].sequence + 10))


def test_a_quiet_stream_ends_at_the_live_edge_with_the_newest_events():
    got = asyncio.run(recent_events(History(), quiet_s=0.1, limit_s=60))
    assert [e.sequence for e in got] == list(range(21, 31))
