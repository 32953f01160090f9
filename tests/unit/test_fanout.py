"""Watch-stream fan-out: a watcher a whole queue behind gets what it holds, then None,
and is dropped; the others go on receiving."""

from __future__ import annotations

import asyncio

from stalwart.fanout import Fanout


def _drain(queue: asyncio.Queue) -> list:
    out = []
    while not queue.empty():
        out.append(queue.get_nowait())
    return out


def test_a_watcher_that_falls_behind_ends_after_what_it_holds():
    async def scenario() -> None:
        fanout: Fanout[int] = Fanout("item", queue_limit=3, advice="list them")
        slow, quick = fanout.subscribe(), fanout.subscribe()
        fanout.publish([1, 2])
        assert _drain(quick) == [1, 2]
        fanout.publish([3, 4])  # slow now holds 1, 2, 3 and has no room for 4
        assert _drain(slow) == [2, 3, None]  # the oldest gave its place to the end
        assert len(fanout) == 1
        fanout.publish([5])
        assert _drain(slow) == [] and _drain(quick) == [3, 4, 5]
        fanout.close_all()
        assert _drain(quick) == [None] and len(fanout) == 0

    asyncio.run(scenario())
