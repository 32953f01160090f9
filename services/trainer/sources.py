"""Where a trainer's work comes from: the coordinator's heartbeats, or a file in tests.

Both only call :meth:`Worker.assign` / :meth:`Worker.request_stop`; the loop in
:mod:`services.trainer.worker` does not know which one drives it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import structlog
from google.protobuf import json_format

from services.trainer.worker import Worker
from stalwart.api import common, coordinator
from stalwart.client.coordinator import CoordinatorClient, NodeSession
from stalwart.client.sessionthread import SessionThread

logger = structlog.get_logger(__name__)


class FileSource:
    """One Assignment read from a JSON file; the trainer exits when the job is done."""

    def __init__(self, worker: Worker, path: Path):
        self.worker = worker
        self.path = path

    async def start(self) -> None:
        assignment = json_format.Parse(self.path.read_text(), coordinator.Assignment())
        self.worker.on_finished = lambda _job: self.worker.request_stop()
        self.worker.assign(assignment)

    async def stop(self) -> None:
        return None


class CoordinatorSource:
    """Register with the coordinator group and follow its heartbeat answers.

    The session heartbeats from a thread of its own (:class:`SessionThread`), so a
    step computed on the worker's loop never holds a beat back; ``client`` must be
    made ``blocking=True``. The NodeSession drops answers from a deposed leader
    (lower epoch), so only the current leader's assignment and directive reach
    the worker, on the worker's loop, in the order they came.
    """

    def __init__(
        self,
        worker: Worker,
        client: CoordinatorClient,
        address: str,
        node_id: str,
        standby: bool,
        telemetry: Callable[[], Mapping[str, float]],
        reports: CoordinatorClient,
    ):
        """``reports``: a client of the worker's loop, for the reports the trainer
        sends (corruption, its job's errors); closed with the source."""
        self.worker = worker
        self.reports = reports
        self.session = NodeSession(
            client,
            common.NODE_ROLE_TRAINER,
            address,
            node_id=node_id,
            standby=standby,
            telemetry=telemetry,
        )
        self.beats = SessionThread(self.session, self._on_update)
        worker.on_step = self._on_step
        # GradientChecks in heartbeat answers go here (services/trainer/dupcheck.py)
        self.on_checks: Callable[[list], None] | None = None

    def _on_step(self, step: int) -> None:
        self.session.step = step  # read by the heartbeat thread

    def _on_update(self, response: coordinator.HeartbeatResponse) -> None:
        if response.gradient_checks and self.on_checks is not None:
            self.on_checks(list(response.gradient_checks))
        if response.directive == coordinator.DIRECTIVE_DRAIN:
            self.worker.assign(None)  # the current step finishes; no new one starts
            return
        has = response.HasField("assignment")
        self.worker.assign(response.assignment if has else None)

    async def start(self) -> None:
        await self.beats.start()

    async def stop(self) -> None:
        await self.beats.stop()  # closes the session's client
        await self.reports.close()
