"""A running job whose model has not reached its paramservers yet is waited for by the
periodic checkpoint orders: no warning, and no failed order (the back-off after a real
failure stays where it was). An order on command still answers UNAVAILABLE."""

from __future__ import annotations

import asyncio
import time

import pytest
from structlog.testing import capture_logs

from services.coordinator import ckptplan
from services.coordinator.checkpoints import Checkpoints
from services.coordinator.control import Control
from services.coordinator.leader import LeaderState
from services.coordinator.membership import NodeRecord, Role
from services.coordinator.settings import CoordinatorSettings
from services.coordinator.statestore import StateStore
from stalwart.api import coordinator, paramserver
from stalwart.errors import ErrorKind, StalwartError
from stalwart.stores import open_store
from tests.unit.coordinator import builders


class _Primary:
    """GetReplicaStatus of a paramserver that holds the jobs in ``held`` at version 0."""

    def __init__(self) -> None:
        self.held: list[str] = []
        self.asked = 0

    async def GetReplicaStatus(self, request, timeout):  # noqa: N802 (the RPC's name)
        self.asked += 1
        return paramserver.GetReplicaStatusResponse(
            jobs=[paramserver.ReplicaJob(job_id=j, version=0) for j in self.held]
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
    checkpoints._last_failed["j"] = 8  # an earlier order really failed
    with capture_logs() as logs:
        for _ in range(3):  # three ticks before the model arrives
            asyncio.run(checkpoints._periodic("j"))
    assert primary.asked == 3
    assert [e for e in logs if e["log_level"] in ("warning", "error")] == []
    assert checkpoints._last_failed == {"j": 8}  # not counted, back-off kept


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
