"""A commit runs to its end even when the push that started it was given up on.

The last push of a synchronous step starts the step's commit inside its own call.
When that call's client gave up (its deadline passed, or the trainer died) while the
commit was under way, the commit was cut short with it: the apply went on in its
thread after the job's lock was released, the step's other pushes waited until their
own deadline, and backups whose commit was cancelled still counted as holding the
step. The primary here waits ``SLOW_COMMIT_S`` before committing step 1 (the
``slow_commit_at_version`` fault), and slot 1's client gives up well before that.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
import torch

from services.paramserver.faults import SLOW_COMMIT_S
from stalwart.errors import RpcError
from tests.helpers import assert_eventually_async
from tests.integration.paramserver.support import (
    assert_same_state,
    call,
    consistency,
    model_header,
    one_hot,
    push_messages,
    push_raw,
    register_raw,
    sgd,
    status,
    stubs,
)

pytestmark = pytest.mark.timeout(300)

JOB = "cancelled-commit"
WAITING_PUSH_S = 30.0  # slot 0's deadline: the commit answers it long before


async def _slot_0_staged(stub) -> bool:
    jobs = {j.job_id: j for j in (await status(stub)).jobs}
    return JOB in jobs and list(jobs[JOB].pushed_slots) == [0]


async def test_a_commit_whose_push_was_given_up_on_still_commits_the_step(launcher) -> None:
    backup = launcher.start("b", "--role", "backup")
    primary = launcher.start("p", "--role", "primary", "--backups", backup.address,
                             "--faults", "slow_commit_at_version=1")  # fmt: skip
    async with stubs() as stub_for:
        stub = stub_for(primary.address)
        header = model_header(JOB, {"w": torch.zeros(4)}, sgd(1.0), consistency("sync"), 2)
        await register_raw(stub, header, {"w": torch.zeros(4)})
        step0 = [push_raw(stub, push_messages(JOB, 0, s, one_hot(s))) for s in (0, 1)]
        assert [a.version for a in await asyncio.gather(*step0)] == [1, 1]

        def push(slot: int, timeout: float):
            messages = push_messages(JOB, 1, slot, one_hot(2 + slot), base_version=1)
            return call(stub.Push(iter(messages), timeout=timeout))

        waiting = asyncio.ensure_future(push(0, WAITING_PUSH_S))
        await assert_eventually_async(lambda: _slot_0_staged(stub))
        with pytest.raises(RpcError) as gave_up:  # its client leaves during the commit
            await push(1, SLOW_COMMIT_S / 4)
        assert gave_up.value.code is grpc.StatusCode.DEADLINE_EXCEEDED

        assert (await waiting).version == 2  # the step committed all the same
        state = await assert_same_state(stub_for, [primary, backup], JOB)
        assert state.version == 2  # and the backup holds it, as acknowledged
