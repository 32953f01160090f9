"""Kill -9 of the primary in the middle of a stream of pushes; promote the backup.

Async mode, SGD lr=1 without momentum, and each push's gradient a distinct
one-hot: push (step k, slot s) subtracts exactly 1 from element s*STEPS + k.
The final parameter therefore says which pushes were applied and how often:
every acknowledged push applied exactly once means every element is exactly -1.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from tests.integration.paramserver.support import (
    assert_same_state,
    consistency,
    group_client,
    model_header,
    one_hot,
    promote,
    pull_raw,
    sgd,
    status,
    stubs,
)

pytestmark = pytest.mark.timeout(480)

SLOTS = 3
STEPS = 12
KILL_AFTER_ACKS = 10  # of SLOTS * STEPS


async def test_kill_primary_mid_stream_every_acked_push_applied_once(launcher) -> None:
    replicas = launcher.start_many({"b": ["--role", "backup"], "c": ["--role", "backup"]})
    b, c = replicas["b"], replicas["c"]
    a = launcher.start("a", "--role", "primary", "--epoch", "1", "--backups", b.address)
    job = "failover"
    addresses = [a.address, b.address, c.address]

    acked: list[tuple[int, int, bool]] = []  # (slot, step, duplicate) in ack order
    in_flight: set[int] = set()
    kills: list[dict] = []
    failover_done = asyncio.Event()

    async with stubs() as stub_for:
        admin = group_client(addresses)
        await admin.register_model(
            model_header(
                job, {"w": torch.zeros(SLOTS * STEPS)}, sgd(1.0), consistency("async"), SLOTS
            ),
            [torch.zeros(SLOTS * STEPS)],
        )
        await assert_same_state(stub_for, [a, b], job)

        async def fail_over() -> None:
            # The failpoint: a crash with pushes in flight, then what the
            # coordinator will do: promote the backup under a higher epoch.
            kills.append({"acked": len(acked), "in_flight": set(in_flight)})
            a.kill()
            reply = await promote(
                stub_for(b.address), epoch=2, backups=[c.address], stub_for=stub_for
            )
            assert reply.epoch == 2 and [j.job_id for j in reply.jobs] == [job]
            failover_done.set()

        async def trainer(slot: int) -> None:
            client = group_client(addresses, retry_for_s=60)
            try:
                for step in range(STEPS):
                    in_flight.add(slot)
                    result = await client.push(
                        job, step, slot, 0, one_hot(slot * STEPS + step, SLOTS * STEPS)
                    )
                    in_flight.discard(slot)
                    acked.append((slot, step, result.duplicate))
                    if len(acked) == KILL_AFTER_ACKS and not kills:
                        await fail_over()
            finally:
                await client.close()

        # generous: a bound against a hang, not a timing check (a loaded machine is slow)
        await asyncio.wait_for(asyncio.gather(*(trainer(s) for s in range(SLOTS))), 360)
        await admin.close()

        assert len(kills) == 1 and failover_done.is_set()
        assert kills[0]["acked"] == KILL_AFTER_ACKS and kills[0]["in_flight"], kills
        assert not a.alive()
        assert sorted((s, k) for s, k, _ in acked) == [
            (s, k) for s in range(SLOTS) for k in range(STEPS)
        ]

        new_primary = await status(stub_for(b.address))
        assert (new_primary.role, new_primary.epoch) == (1, 2)  # REPLICA_ROLE_PRIMARY
        version, params = await pull_raw(stub_for(b.address), job, epoch=2)
        # each push applied exactly once: nothing lost, nothing twice
        assert torch.equal(params["w"], torch.full((SLOTS * STEPS,), -1.0)), params["w"]
        assert version == SLOTS * STEPS
        # the new primary's new backup holds the very same state
        state = await assert_same_state(stub_for, [b, c], job)
        assert state.version == SLOTS * STEPS
