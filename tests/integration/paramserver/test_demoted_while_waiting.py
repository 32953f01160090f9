"""A primary configured as a backup while a push waits under it answers that push with
NOT_PRIMARY: it neither applies nor acknowledges anything once demoted.

A duplicate push waits (up to ``SYNC_WAIT_S``) for a backup to hold its step before
it is acknowledged. The replica was checked to be the primary when the push arrived
only; demoted meanwhile (the group failed over under it and the leader made it a
backup of the new primary), it had no backup left to count, needed none, and
acknowledged a step that the new primary never received.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
import torch

from tests.helpers import assert_eventually
from tests.integration.paramserver.support import (
    configure_backup,
    consistency,
    expect_error,
    metric,
    model_header,
    one_hot,
    push_messages,
    push_raw,
    register_raw,
    sgd,
    stubs,
)

pytestmark = pytest.mark.timeout(300)

JOB = "demoted-while-waiting"
RECEIVED = "stalwart_paramserver_push_phase_seconds_count"


async def test_a_push_waiting_for_a_backup_is_refused_once_its_replica_is_demoted(
    launcher,
) -> None:
    backup = launcher.start("b", "--role", "backup")
    primary = launcher.start("p", "--role", "primary", "--backups", backup.address)
    async with stubs() as stub_for:
        stub = stub_for(primary.address)
        header = model_header(JOB, {"w": torch.zeros(4)}, sgd(1.0), consistency("async"), 1)
        await register_raw(stub, header, {"w": torch.zeros(4)})
        assert (await push_raw(stub, push_messages(JOB, 0, 0, one_hot(0)))).version == 1

        backup.kill()  # step 1 is applied here and held by no backup: not acknowledged
        await expect_error(push_raw(stub, push_messages(JOB, 1, 0, one_hot(1), 1)),
                           grpc.StatusCode.UNAVAILABLE, "NO_INSYNC_BACKUP")  # fmt: skip

        received = metric(primary, RECEIVED, phase="receive")
        retry = asyncio.ensure_future(push_raw(stub, push_messages(JOB, 1, 0, one_hot(1), 1)))
        # the retry is read and waits for a backup to hold step 1; then the group
        # fails over under it: the leader makes this replica a backup at epoch 2
        await asyncio.to_thread(
            assert_eventually, lambda: metric(primary, RECEIVED, phase="receive") > received
        )
        assert not retry.done()
        await configure_backup(stub, 2)
        await expect_error(retry, grpc.StatusCode.FAILED_PRECONDITION, "NOT_PRIMARY")
