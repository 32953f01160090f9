"""A push answered while a backup is being installed waits for the install.

A primary whose only backup came back empty refuses to acknowledge anything
until it has installed the job there (min-insync 1). The install follows within
a resync round; a push that arrives in that window used to be refused with
NO_INSYNC_BACKUP and sent its trainer into the SDK's retry backoff (a second and
more after a promotion). It now waits for the install, up to
``servicer.SYNC_WAIT_S``, and is acknowledged.

The restarted backup holds the install ``INSTALL_HELD_S`` (the
``slow_install_seconds`` fault), so the push always lands in that window: without
it the resync could install the backup before the push arrived, and the test
passed without the wait.
"""

from __future__ import annotations

import grpc
import pytest
import torch

from tests.integration.paramserver.support import (
    consistency,
    expect_error,
    group_client,
    model_header,
    one_hot,
    push_messages,
    push_raw,
    sgd,
    stubs,
)

pytestmark = pytest.mark.timeout(300)

JOB = "sync-wait"
INSTALL_HELD_S = 0.5  # well inside SYNC_WAIT_S, even with the install's own time


async def test_a_duplicate_waits_for_the_backup_being_installed(launcher) -> None:
    backup = launcher.start("b", "--role", "backup")
    primary = launcher.start("p", "--role", "primary", "--backups", backup.address)
    client = group_client([primary.address, backup.address])
    async with stubs() as stub_for:
        try:
            header = model_header(JOB, {"w": torch.zeros(4)}, sgd(1.0), consistency("async"), 1)
            await client.register_model(header, [torch.zeros(4)])
            await client.push(JOB, 0, 0, 0, one_hot(0))

            backup.kill()
            # applied here, held by no backup: refused, once the wait has passed
            await expect_error(
                push_raw(stub_for(primary.address), push_messages(JOB, 1, 0, one_hot(1))),
                grpc.StatusCode.UNAVAILABLE, "NO_INSYNC_BACKUP",
            )  # fmt: skip

            port = backup.address.rsplit(":", 1)[1]
            launcher.start(
                "b-restarted", "--role", "backup", "--port", port,
                "--faults", f"slow_install_seconds={INSTALL_HELD_S}",
            )  # fmt: skip
            # sent as soon as the backup serves: during its install
            answer = await push_raw(stub_for(primary.address), push_messages(JOB, 1, 0, one_hot(1)))
            assert (answer.version, answer.duplicate) == (2, True)
        finally:
            await client.close()
