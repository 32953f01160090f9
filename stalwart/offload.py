"""Where small CPU work runs in an asyncio service: on the loop, or in the executor."""

from __future__ import annotations

import asyncio

# Work on fewer bytes than this runs on the event loop itself. A hop to the
# executor and back costs two thread switches and a GIL hand-off each way,
# more than checking or applying a small model (well under a millisecond), and
# on a busy machine every hop waits for a core. Larger work goes to the executor
# so that heartbeats and other calls are not held up behind it.
INLINE_BYTES = 1 << 20


async def off_loop(fn, *args, nbytes: int | None = None):
    """``fn(*args)`` in the executor, or inline when it works on under
    ``INLINE_BYTES`` (``nbytes``: how many it works on; None: always the executor)."""
    if nbytes is not None and nbytes < INLINE_BYTES:
        return fn(*args)
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


def tensor_bytes(tensors) -> int:
    return sum(t.nbytes for t in tensors)
