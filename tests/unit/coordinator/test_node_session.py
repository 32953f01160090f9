"""NodeSession keeps the highest coordinator epoch and drops a deposed leader's answers."""

from __future__ import annotations

import asyncio

import grpc

from stalwart.api import common, coordinator
from stalwart.client.coordinator import NodeSession
from stalwart.errors import RpcError


class FakeClient:
    def __init__(self, answers):
        self.answers = list(answers)
        self.registrations = 0

    async def register_node(self, role, address, **kw):
        self.registrations += 1
        return coordinator.RegisterNodeResponse(
            node_id="n1", lease_ms=1000, heartbeat_interval_ms=200, epoch=2
        )

    async def heartbeat(self, node_id, epoch, step, telemetry):
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def beat(epoch: int, job: str = "") -> coordinator.HeartbeatResponse:
    response = coordinator.HeartbeatResponse(epoch=epoch, directive=coordinator.DIRECTIVE_CONTINUE)
    if job:
        response.assignment.job_id = job
    return response


def test_drops_lower_epochs_and_reregisters_when_unknown():
    async def scenario():
        unknown = RpcError(grpc.StatusCode.NOT_FOUND, "lapsed", "UNKNOWN_NODE")
        client = FakeClient([beat(3, "new"), beat(2, "stale"), unknown, beat(3, "back")])
        session = NodeSession(client, common.NODE_ROLE_TRAINER, "h:1")
        await session.register()
        assert session.epoch == 2 and session.node_id == "n1"
        assert (await session.beat()).assignment.job_id == "new" and session.epoch == 3
        assert await session.beat() is None  # from the deposed epoch-2 leader
        assert session.assignment.job_id == "new" and session.dropped == 1
        assert await session.beat() is None and client.registrations == 2
        assert session.epoch == 3  # registering again never lowers the epoch
        assert (await session.beat()).assignment.job_id == "back"

    asyncio.run(scenario())
