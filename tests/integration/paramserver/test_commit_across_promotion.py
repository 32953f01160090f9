"""A primary promoted again while one of its commits is under way stays the primary.

The leader promotes a group's recorded primary again above a stray claim: it
configures the backup at the new epoch first, then promotes the primary. A commit
the primary had begun under the old epoch then reached a backup that refused it,
and the primary fenced itself on that refusal, though the backup was at its own new
epoch; the leader failed the group over. The re-promotion had also cleared the
pushes the commit was applying. Now the primary asks the backup's epoch and fences
only below it: the backup is dropped, the step refused, and the client's retry is
acknowledged once the backup holds the job again (fault
``commit_across_promotion_at_version``).
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from stalwart.api import common
from stalwart.errors import RpcError
from tests.helpers import assert_eventually
from tests.integration.paramserver.support import (
    assert_same_state,
    call,
    consistency,
    model_header,
    one_hot,
    promote,
    push_messages,
    push_raw,
    register_raw,
    sgd,
    status,
    stubs,
)

pytestmark = pytest.mark.timeout(300)

JOB = "commit-across-promotion"


def _held(primary) -> bool:
    """The fault fired: the commit's request is made under epoch 1 and held. (Its
    name alone is in the log's first line, which lists the faults turned on: waiting
    for that, the promotion came before the commit under load, and the retry's
    commit was then held for good.)"""
    return any("fault fired" in line and "commit_across_promotion" in line
               for line in primary.log_tail(400).splitlines())  # fmt: skip


async def test_a_commit_begun_before_a_re_promotion_fences_nothing(launcher) -> None:
    backup = launcher.start("b", "--role", "backup")
    primary = launcher.start("p", "--role", "primary", "--backups", backup.address,
                             "--faults", "commit_across_promotion_at_version=1")  # fmt: skip
    async with stubs() as stub_for:
        stub = stub_for(primary.address)
        header = model_header(JOB, {"w": torch.zeros(4)}, sgd(1.0), consistency("async"), 1)
        await register_raw(stub, header, {"w": torch.zeros(4)})
        assert (await push_raw(stub, push_messages(JOB, 0, 0, one_hot(0)))).version == 1

        held = asyncio.ensure_future(push_raw(stub, push_messages(JOB, 1, 0, one_hot(1), 1)))
        await asyncio.to_thread(assert_eventually, lambda: _held(primary))
        await promote(stub, 2, [backup.address], stub_for)  # as the leader does

        # the commit, sent under epoch 1, is refused by the backup at 2: not acknowledged
        # (UNAVAILABLE, which the channel retries: the retry, at epoch 1, is refused)
        with pytest.raises(RpcError) as refused:
            await call(held)
        assert refused.value.reason in ("NO_INSYNC_BACKUP", "STALE_EPOCH"), refused.value
        after = await status(stub)
        assert (after.role, after.epoch) == (common.REPLICA_ROLE_PRIMARY, 2)

        retry = await push_raw(stub, push_messages(JOB, 1, 0, one_hot(1), 1, epoch=2))
        assert retry.version == 2
        state = await assert_same_state(stub_for, [primary, backup], JOB)
        assert state.version == 2
