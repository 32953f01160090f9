"""The leader's periodic checkpoint orders against a paramserver that stands still.

A running job whose model has not reached its paramservers yet is waited for: no
warning, and no failed order (the back-off after a real failure stays where it was);
an order on command still answers UNAVAILABLE. A job that stops moving past a mark is
checkpointed where it stands, and a slow one keeps its next mark."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from structlog.testing import capture_logs

from services.coordinator import ckptplan
from services.coordinator.checkpoints import ORDER_REACH_S, Checkpoints
from services.coordinator.control import Control
from services.coordinator.leader import LeaderState
from services.coordinator.membership import NodeRecord, Role
from services.coordinator.settings import CoordinatorSettings
from services.coordinator.statestore import StateStore
from stalwart.api import common, coordinator, paramserver
from stalwart.errors import ErrorKind, RpcError, StalwartError
from stalwart.stores import open_store
from tests.unit.coordinator import builders


class _Primary:
    """A paramserver that holds the jobs in ``held`` at ``version``, which never moves
    (a hung job): SaveCheckpoint of a higher version times out as the real one does."""

    def __init__(self, version: int = 0) -> None:
        self.held: list[str] = []
        self.version = version
        self.asked = 0
        self.saves: list[int] = []  # the versions SaveCheckpoint was asked for

    async def GetReplicaStatus(self, request, timeout):  # noqa: N802 (the RPC's name)
        self.asked += 1
        return paramserver.GetReplicaStatusResponse(
            jobs=[paramserver.ReplicaJob(job_id=j, version=self.version) for j in self.held]
        )

    async def SaveCheckpoint(self, request, timeout):  # noqa: N802 (the RPC's name)
        self.saves.append(request.at_version)
        assert request.reach_timeout_seconds == ORDER_REACH_S
        if request.at_version > self.version:  # as the real one answers once reach passes
            raise RpcError(grpc.StatusCode.FAILED_PRECONDITION,
                           f"version {request.at_version} not reached within "
                           f"{ORDER_REACH_S:g}s (at {self.version})")  # fmt: skip
        return paramserver.SaveCheckpointResponse(
            shard=common.ShardState(shard=0, version=self.version)
        )


def _checkpoints(tmp_path, primary: _Primary) -> Checkpoints:
    settings = CoordinatorSettings(store_url=f"shm://{tmp_path}/state",
                                   checkpoint_url=f"shm://{tmp_path}/ckpt")  # fmt: skip
    leader = LeaderState(settings.leader_ttl_seconds, settings.leader_margin_seconds)
    leader.acquired(1, "c1@127.0.0.1:1", time.monotonic() + 3600)
    control = Control(settings, StateStore(open_store(settings.store_url), "t"), leader)
    asyncio.run(control.take_over(1))
    job = builders.job("j", ("t1",), running=True)
    job.spec = coordinator.JobSpec(num_slots=1, steps=100, batch_size=1, checkpoint_interval=4)
    control.jobs["j"] = control.live_jobs["j"] = job
    control.members.nodes["p1"] = NodeRecord("p1", Role.PARAMSERVER, "p1:1")
    control.groups[0] = ("p1", 1)
    return Checkpoints(control, lambda _address: primary, lambda _shard: [], settings)


def test_a_job_not_on_its_primaries_yet_is_no_failed_order(tmp_path) -> None:
    primary = _Primary()
    checkpoints = _checkpoints(tmp_path, primary)
    checkpoints._marks_of("j").last_failed = 8  # an earlier order really failed
    with capture_logs() as logs:
        for _ in range(3):  # three ticks before the model arrives
            asyncio.run(checkpoints._periodic("j"))
    assert primary.asked == 3
    assert [e for e in logs if e["log_level"] in ("warning", "error")] == []
    assert checkpoints._marks_of("j").last_failed == 8  # not counted, back-off kept


def test_a_job_that_hangs_past_a_mark_is_checkpointed_where_it_stands(tmp_path) -> None:
    # the job went past mark 8 while the save of 4 was under way, then hung at 9
    primary = _Primary(version=9)
    primary.held.append("j")
    checkpoints = _checkpoints(tmp_path, primary)
    checkpoints._marks_of("j").last_saved = 4
    for _ in range(3):
        asyncio.run(checkpoints._periodic("j"))
    # the first look cannot tell a hang from a step under way: the catch-up at 10,
    # not reached; the next finds 9 again and saves it; then the next mark, 12
    assert primary.saves == [10, 9, 12]
    assert checkpoints._marks_of("j").last_saved == 9
    assert checkpoints._marks_of("j").last_failed == -1  # not reaching is no failure
    assert [m.step for m in asyncio.run(checkpoints.list("j"))] == [9]


def test_a_slow_job_keeps_its_next_mark(tmp_path) -> None:
    # a mark not reached within an order's reach is ordered again, not skipped as a
    # failed order would be (one step a second, a mark 500 steps on: many orders)
    primary = _Primary(version=1)
    primary.held.append("j")
    checkpoints = _checkpoints(tmp_path, primary)
    for version in (1, 2, 3):
        primary.version = version
        asyncio.run(checkpoints._periodic("j"))
    assert primary.saves == [4, 4, 4]
    assert checkpoints._marks_of("j").last_failed == -1
    # it reached 4 between two looks: a catch-up at 5, then 4 where it stands
    primary.version = 4
    for _ in range(2):
        asyncio.run(checkpoints._periodic("j"))
    assert primary.saves == [4, 4, 4, 5, 4]
    assert [m.step for m in asyncio.run(checkpoints.list("j"))] == [4]


def test_an_order_on_command_still_says_why_it_cannot_be_taken(tmp_path) -> None:
    checkpoints = _checkpoints(tmp_path, _Primary())
    with pytest.raises(StalwartError) as raised:
        asyncio.run(checkpoints.create("j"))
    assert raised.value.kind is ErrorKind.UNAVAILABLE
    assert "a primary does not hold j yet" in raised.value.message


@pytest.mark.parametrize(
    ("versions", "highest", "want"),
    [
        ([3, 5], False, 3),
        ([3, 5], True, 5),
        ([3, None], False, None),  # one shard's primary has no model yet
        ([None], True, None),
        ([], False, None),
    ],
)
def test_job_version(versions, highest, want) -> None:
    assert ckptplan.job_version(versions, highest) == want


class _Moving(_Primary):
    """A primary whose job commits a step between any two calls: an order aimed at the
    version it answered is always overtaken."""

    async def GetReplicaStatus(self, request, timeout):  # noqa: N802 (the RPC's name)
        answer = await super().GetReplicaStatus(request, timeout)
        self.version += 1
        return answer

    async def SaveCheckpoint(self, request, timeout):  # noqa: N802 (the RPC's name)
        self.saves.append(request.at_version)
        if request.at_version < self.version:
            raise RpcError(grpc.StatusCode.FAILED_PRECONDITION,
                           f"job is at version {self.version}, past the asked "
                           f"{request.at_version}")  # fmt: skip
        self.version = request.at_version  # it waited until the job got there
        return paramserver.SaveCheckpointResponse(
            shard=common.ShardState(shard=0, version=self.version)
        )


def test_an_order_on_command_overtaken_is_aimed_further_ahead(tmp_path) -> None:
    primary = _Moving(version=20)
    primary.held.append("j")
    checkpoints = _checkpoints(tmp_path, primary)
    manifest = asyncio.run(checkpoints.create("j"))
    assert primary.saves[0] == 20 and len(primary.saves) == 2  # overtaken once, not again
    assert manifest.step == primary.saves[-1] > 21
