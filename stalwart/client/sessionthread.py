"""A :class:`NodeSession` that heartbeats from a thread of its own.

A trainer computes a short step on its event loop (services/trainer/worker.py,
``computes_inline``): the hop to an executor thread and back cost about a fifth of
such a step. Heartbeats must not wait for that loop, or a step that turns slow
would silence them and the node would be declared dead instead of slow. So the
trainer's session runs here, on its own thread and its own event loop, with a
:class:`CoordinatorClient` made ``blocking=True``.

Blocking calls, not a second grpc.aio loop: grpc.aio wakes every loop that uses it
on every gRPC event of the process, and a second one cost each call of the first
about 45 µs more CPU (230 → 275 µs a unary call, measured); a blocking channel on
a side thread cost nothing measurable.

The session's own decisions (epochs, registering again) are made on its thread;
each answer it accepts is handed to ``on_update`` on the loop that called
:meth:`start`, in the order the answers came. ``session.step`` and the telemetry callable are
read from the heartbeat thread: plain attributes, written by the owner's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable

from stalwart.api import coordinator
from stalwart.client.coordinator import NodeSession


class SessionThread:
    """Runs ``session`` (its client made ``blocking=True``) on a thread of its own.

    ``await start()`` returns once registered (or raises the registration's error);
    ``await stop()`` ends the heartbeats and closes the session's client. Each once:
    a stopped SessionThread is not started again.
    """

    def __init__(
        self,
        session: NodeSession,
        on_update: Callable[[coordinator.HeartbeatResponse], None],
    ) -> None:
        if not session.client.blocking:
            raise ValueError("a session on its own thread needs a blocking CoordinatorClient")
        self.session = session
        self.on_update = on_update
        # The heartbeat thread's loop, made before the thread starts so that stop()
        # can always reach it: a set() queued before the loop runs runs first thing.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._done = asyncio.Event()  # the one stop signal; set on the heartbeat loop
        self._thread: threading.Thread | None = None

    async def start(self) -> None:
        owner = asyncio.get_running_loop()
        registered: asyncio.Future = owner.create_future()
        self.session.on_update = lambda r: owner.call_soon_threadsafe(self.on_update, r)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._serve, args=(self._run(owner, registered),),
            name="heartbeats", daemon=True,
        )  # fmt: skip
        self._thread.start()
        await registered

    async def stop(self) -> None:
        if self._thread is None:
            return
        # closed already when the thread ended on its own (a failed registration)
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._done.set)
        await asyncio.to_thread(self._thread.join)
        self._thread = None

    def _serve(self, main) -> None:
        """The heartbeat thread: ``main`` on the loop made for it, which the Runner
        closes at the end (after cancelling what is left, as asyncio.run does)."""
        with asyncio.Runner(loop_factory=lambda: self._loop) as runner:
            runner.run(main)

    async def _run(self, owner: asyncio.AbstractEventLoop, registered: asyncio.Future) -> None:
        try:
            await self.session.start()
        except BaseException as exc:  # noqa: BLE001 - handed to start()'s caller
            owner.call_soon_threadsafe(_settle, registered, exc)
            await self.session.client.close()
            return
        owner.call_soon_threadsafe(_settle, registered, None)
        try:
            await self._done.wait()
        finally:
            await self.session.stop()
            await self.session.client.close()


def _settle(future: asyncio.Future, error: BaseException | None) -> None:
    if future.done():  # start() was cancelled meanwhile
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
