"""`stalwart failover` waiting for the next leader (stalwart/cli/admin.py)."""

import asyncio
import time
from types import SimpleNamespace

import grpc

from stalwart.cli.admin import _next_leader
from stalwart.errors import RpcError


class Statuses:
    """Answers cluster_status from a list, then repeats the last answer."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.calls = 0

    async def cluster_status(self):
        self.calls += 1
        answer = self.answers[0] if len(self.answers) == 1 else self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def status(epoch: int, leader: str = "127.0.0.1:7001") -> SimpleNamespace:
    return SimpleNamespace(epoch=epoch, leader_address=leader, leader_id=f"c{epoch}")


def test_the_first_status_of_a_later_epoch_with_a_leader_is_returned():
    client = Statuses(
        RpcError(grpc.StatusCode.UNAVAILABLE, "electing"), status(3, ""), status(3), status(4)
    )
    got = asyncio.run(_next_leader(client, 2, time.monotonic() + 30))
    assert got.epoch == 3 and got.leader_address
    assert client.calls == 3


def test_none_once_the_deadline_passes_without_one():
    client = Statuses(status(2))  # the old epoch: nobody took over
    got = asyncio.run(_next_leader(client, 2, time.monotonic() + 0.3))
    assert got is None and client.calls >= 1


class Hanging:
    async def cluster_status(self):
        await asyncio.sleep(3600)


def test_a_status_call_that_hangs_is_cut_short_at_the_deadline():
    assert asyncio.run(_next_leader(Hanging(), 2, time.monotonic() + 0.3)) is None
