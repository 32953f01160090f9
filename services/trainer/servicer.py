"""TrainerService: operators look at a trainer and stop it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from services.trainer.worker import Worker
from stalwart.api import common, trainer
from stalwart.server import rpc_handler


class TrainerServicer:
    def __init__(
        self,
        worker: Worker,
        node_id: Callable[[], str],
        on_stop: Callable[[], None],
        grace_s: float,
    ):
        self.worker = worker
        self.node_id = node_id
        self.on_stop = on_stop
        self.grace_s = grace_s
        self.loop_task: asyncio.Task | None = None

    @rpc_handler
    async def GetTrainerStatus(self, request, context):
        w, a = self.worker, self.worker.current
        return trainer.GetTrainerStatusResponse(
            node_id=self.node_id(),
            job_id=a.job_id if a else "",
            slot=a.slot if a and not a.standby else -1,
            step=w.stats.step,
            standby=bool(a and a.standby),
            device=w.device,
            step_time_seconds=w.stats.step_time_seconds,
            samples_per_second=w.stats.samples_per_second,
            role=common.NODE_ROLE_TRAINER,
        )

    @rpc_handler
    async def StopTrainer(self, request, context):
        """Finish the current step, then exit (the answer names the last step pushed)."""
        self.worker.request_stop()
        if self.loop_task is not None:
            await asyncio.wait({self.loop_task}, timeout=self.grace_s)
        self.on_stop()
        return trainer.StopTrainerResponse(step=self.worker.stats.step)
