"""A backup that dies and comes back on the same port is caught up by state transfer.

Two groups side by side, so that one round of process starts serves both:
  - ``--min-insync 1`` (the default): while no backup holds the job, pushes are
    refused with UNAVAILABLE [NO_INSYNC_BACKUP]; the SDK retries them until the
    restarted backup is re-installed, and then they are acknowledged.
  - ``--min-insync 0``: pushes go on, acknowledged by the primary alone.
Gradients are one-hots (SGD lr=1), so the final parameter shows that every push
was applied exactly once, and primary and backup end bitwise identical.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
import torch

from stalwart.errors import RpcError
from tests.helpers import assert_eventually_async
from tests.integration.paramserver.support import (
    assert_same_state,
    consistency,
    expect_error,
    group_client,
    model_header,
    one_hot,
    pull_raw,
    push_messages,
    push_raw,
    sgd,
    status,
    stubs,
)

pytestmark = pytest.mark.timeout(420)

JOB = "catchup"
STEPS = 9
DOWN_FROM, UP_FROM = 3, 6  # steps pushed while the backup is down: [3, 6)


def _port(address: str) -> str:
    return address.rsplit(":", 1)[1]


async def test_backup_restarted_on_its_port_catches_up(launcher) -> None:
    backups = launcher.start_many({"b-strict": ["--role", "backup"], "b-lax": ["--role", "backup"]})
    primaries = launcher.start_many(
        {
            "p-strict": ["--role", "primary", "--backups", backups["b-strict"].address],
            "p-lax": [
                "--role",
                "primary",
                "--backups",
                backups["b-lax"].address,
                "--min-insync",
                "0",
            ],
        }  # fmt: skip
    )
    groups = {k: (primaries[f"p-{k}"], backups[f"b-{k}"]) for k in ("strict", "lax")}
    # retries must outlast a backup restart on a loaded machine (seconds to a minute)
    clients = {
        k: group_client([p.address, b.address], retry_for_s=180.0) for k, (p, b) in groups.items()
    }
    async with stubs() as stub_for:
        try:
            for kind, (p, b) in groups.items():
                header = model_header(
                    JOB, {"w": torch.zeros(STEPS)}, sgd(1.0), consistency("async"), 1
                )
                await clients[kind].register_model(header, [torch.zeros(STEPS)])
                for step in range(DOWN_FROM):
                    await clients[kind].push(JOB, step, 0, 0, one_hot(step, STEPS))
                assert (await assert_same_state(stub_for, [p, b], JOB)).version == DOWN_FROM

            for _, b in groups.values():
                b.kill()

            # strict: refused while no backup holds the job, the same again on retry
            p = groups["strict"][0]
            for _ in range(2):
                await expect_error(
                    push_raw(
                        stub_for(p.address),
                        push_messages(JOB, DOWN_FROM, 0, one_hot(DOWN_FROM, STEPS)),
                    ),
                    grpc.StatusCode.UNAVAILABLE,
                    "NO_INSYNC_BACKUP",
                )
            backup_view = (await status(stub_for(p.address))).backups
            assert [(x.in_sync, bool(x.last_error)) for x in backup_view] == [(False, True)]

            async def strict_pushes():  # the SDK retries until the backup is back
                return [
                    await clients["strict"].push(JOB, step, 0, 0, one_hot(step, STEPS))
                    for step in range(DOWN_FROM, UP_FROM)
                ]

            strict = asyncio.create_task(strict_pushes())

            # lax: acknowledged by the primary alone, every one a first application
            lax = [
                await clients["lax"].push(JOB, step, 0, 0, one_hot(step, STEPS))
                for step in range(DOWN_FROM, UP_FROM)
            ]
            assert [(r.version, r.duplicate) for r in lax] == [
                (v + 1, False) for v in range(DOWN_FROM, UP_FROM)
            ]
            assert not strict.done()

            # both backups come back, empty, on their old ports
            restarted = launcher.start_many(
                {
                    f"b-{kind}-restarted": ["--role", "backup", "--port", _port(b.address)]
                    for kind, (_, b) in groups.items()
                }
            )
            groups = {k: (p, restarted[f"b-{k}-restarted"]) for k, (p, _) in groups.items()}

            done = await asyncio.wait_for(strict, 180)
            # step 3 had been applied on the primary before it was refused: the
            # retry is acknowledged as a duplicate, not applied again
            assert [r.version for r in done] == [v + 1 for v in range(DOWN_FROM, UP_FROM)]
            for kind in groups:
                for step in range(UP_FROM, STEPS):
                    result = await clients[kind].push(JOB, step, 0, 0, one_hot(step, STEPS))
                    assert (result.version, result.duplicate) == (step + 1, False)

            for kind, (p, b) in groups.items():
                await assert_eventually_async(
                    lambda p=p, b=b: _caught_up(stub_for, p, b), timeout=30
                )
                state = await assert_same_state(stub_for, [p, b], JOB)
                assert state.version == STEPS, kind
                _, params = await pull_raw(stub_for(p.address), JOB)
                assert torch.equal(params["w"], torch.full((STEPS,), -1.0)), (kind, params["w"])
        finally:
            await asyncio.gather(*(c.close() for c in clients.values()))


async def _caught_up(stub_for, primary, backup):
    """The pair holds the same state; a backup that has not installed the job yet
    (NOT_FOUND: the primary's catch-up has not reached it) is not there yet."""
    try:
        return await assert_same_state(stub_for, [primary, backup], JOB)
    except RpcError as err:
        if err.code != grpc.StatusCode.NOT_FOUND:
            raise
        raise AssertionError(f"{backup.name} holds no {JOB!r} yet: {err.message}") from err
