"""Split brain: a deposed primary (partitioned, or revived with its old flags) cannot write.

Epochs fence it: its backups refuse replication from a lower epoch, and it
fences itself on that answer. An epoch only rises by the coordinator's word
(Promote, ConfigureReplica): a higher epoch in any other request is refused and
never adopted, so no caller can depose a primary by naming a big number.
"""

from __future__ import annotations

import signal

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2

from stalwart.api import common, paramserver
from tests.helpers import assert_eventually_async
from tests.integration.paramserver.support import (
    assert_same_state,
    consistency,
    expect_error,
    fingerprint,
    group_client,
    health_status,
    model_header,
    promote,
    pull_raw,
    push_messages,
    push_raw,
    register_raw,
    sgd,
    signal_group,
    status,
    stubs,
)

pytestmark = pytest.mark.timeout(240)

Code = grpc.StatusCode
JOB = "fencing"
DEPOSED = {"FENCED", "STALE_EPOCH"}


def initial() -> dict[str, torch.Tensor]:
    return {"w": torch.arange(6, dtype=torch.float32), "b": torch.ones(2)}


def grads(value: float) -> dict[str, torch.Tensor]:
    return {"w": torch.full((6,), value), "b": torch.full((2,), value)}


async def test_partitioned_primary_is_fenced_and_a_revived_one_cannot_write(launcher) -> None:
    b = launcher.start("b", "--role", "backup")
    primary_flags = ["--role", "primary", "--epoch", "1", "--backups", b.address]
    a = launcher.start("a", *primary_flags)
    async with stubs() as stub_for:
        client = group_client([a.address, b.address])
        try:
            header = model_header(JOB, initial(), sgd(0.5), consistency("async"), num_slots=1)
            await client.register_model(header, list(initial().values()))
            for step in range(2):
                await client.push(JOB, step, 0, step, grads(1.0))
            settled = await assert_same_state(stub_for, [a, b], JOB)
            assert settled.version == 2

            # --- partition: A frozen, B promoted, A back without knowing ---
            signal_group(a, signal.SIGSTOP)
            try:
                reply = await promote(stub_for(b.address), epoch=2)
                assert reply.epoch == 2
            finally:
                signal_group(a, signal.SIGCONT)
            assert (await status(stub_for(a.address))).role == common.REPLICA_ROLE_PRIMARY

            # a writer that still believes in epoch 1 goes to the old primary; tiny
            # chunks keep it forwarding after the backup refused the header
            stale = push_messages(JOB, 2, 0, grads(5.0), 2, epoch=1, chunk_bytes=4)
            await expect_error(
                push_raw(stub_for(a.address), stale),
                Code.FAILED_PRECONDITION,
                DEPOSED,
            )
            for replica in (a, b):  # nothing applied anywhere
                now = await fingerprint(stub_for(replica.address), JOB)
                assert (now.version, now.combined) == (settled.version, settled.combined)
            fenced = await status(stub_for(a.address))
            assert fenced.role == common.REPLICA_ROLE_FENCED
            await assert_eventually_async(
                lambda: _is(health_status(a.address), health_pb2.HealthCheckResponse.NOT_SERVING)
            )
            await expect_error(
                pull_raw(stub_for(a.address), JOB, epoch=1), Code.FAILED_PRECONDITION, DEPOSED
            )

            # the SDK finds the new primary (highest epoch) and goes on there
            result = await client.push(JOB, 2, 0, 2, grads(1.0))
            assert (result.version, client.primary, client.epoch) == (3, b.address, 2)
            new_state = await fingerprint(stub_for(b.address), JOB)
            assert new_state.version == 3
            _, params = await pull_raw(stub_for(b.address), JOB, epoch=2)
            assert torch.equal(params["w"], initial()["w"] - 1.5)

            # --- the old primary revived with its original flags (primary, epoch 1),
            # twice: once on its old port, where an epoch-1 writer reaches it
            # first, and once elsewhere, where a client that knows epoch 2 does ---
            a.kill()
            port = a.address.rsplit(":", 1)[1]
            revived = launcher.start_many(
                {"a-revived": [*primary_flags, "--port", port], "a-revived-2": primary_flags}
            )
            for proc in revived.values():
                st = await status(stub_for(proc.address))
                assert (st.role, st.epoch) == (common.REPLICA_ROLE_PRIMARY, 1)

            # it cannot write: registering (other initial values) needs its backup,
            # which now is the epoch-2 primary and refuses the stale epoch
            a = revived["a-revived"]
            other = {"w": torch.zeros(6), "b": torch.zeros(2)}
            err = await expect_error(
                register_raw(stub_for(a.address), header, other), Code.FAILED_PRECONDITION, DEPOSED
            )
            assert "backup refused" in err.message
            untouched = await fingerprint(stub_for(b.address), JOB)
            assert (untouched.version, untouched.combined) == (3, new_state.combined)
            assert (await status(stub_for(a.address))).role == common.REPLICA_ROLE_FENCED
            await assert_eventually_async(
                lambda: _is(health_status(a.address), health_pb2.HealthCheckResponse.NOT_SERVING)
            )
            await expect_error(
                push_raw(stub_for(a.address), push_messages(JOB, 3, 0, grads(1.0), 3, epoch=2)),
                Code.FAILED_PRECONDITION,
                DEPOSED,
            )

            # the other order: the first thing it hears of is a client with epoch 2,
            # which it refuses without adopting the number ...
            a2 = revived["a-revived-2"]
            await expect_error(
                pull_raw(stub_for(a2.address), JOB, epoch=2), Code.FAILED_PRECONDITION,
                "UNKNOWN_EPOCH",
            )  # fmt: skip
            st = await status(stub_for(a2.address))
            assert (st.role, st.epoch) == (common.REPLICA_ROLE_PRIMARY, 1)
            # ... and its first write is refused by its backup, which fences it
            err = await expect_error(
                register_raw(stub_for(a2.address), header, other), Code.FAILED_PRECONDITION, DEPOSED
            )
            assert "backup refused" in err.message
            assert (await status(stub_for(a2.address))).role == common.REPLICA_ROLE_FENCED
            untouched = await fingerprint(stub_for(b.address), JOB)
            assert (untouched.version, untouched.combined) == (3, new_state.combined)

            # meanwhile the SDK keeps writing to the real primary
            result = await client.push(JOB, 3, 0, 3, grads(1.0))
            assert (result.version, client.primary) == (4, b.address)
        finally:
            await client.close()


async def test_a_made_up_epoch_is_refused_and_the_primary_keeps_serving(launcher) -> None:
    """The grpcurl call that used to depose a primary: Pull with epoch 1001."""
    b = launcher.start("b", "--role", "backup")
    a = launcher.start("a", "--role", "primary", "--epoch", "1", "--backups", b.address)
    async with stubs() as stub_for:
        client = group_client([a.address, b.address])
        try:
            header = model_header(JOB, initial(), sgd(0.5), consistency("async"), num_slots=1)
            await client.register_model(header, list(initial().values()))
            await client.push(JOB, 0, 0, 0, grads(1.0))

            err = await expect_error(
                pull_raw(stub_for(a.address), JOB, since_version=-1, epoch=1001),
                Code.FAILED_PRECONDITION, "UNKNOWN_EPOCH",
            )  # fmt: skip
            assert "epoch 1001 is newer than this replica's 1" in err.message
            await expect_error(
                push_raw(stub_for(a.address), push_messages(JOB, 1, 0, grads(9.0), 1, epoch=1001)),
                Code.FAILED_PRECONDITION, "UNKNOWN_EPOCH",
            )  # fmt: skip
            # replication traffic naming a higher epoch does not move the backup either
            commit = paramserver.ReplicateCommitRequest(job_id=JOB, epoch=1001, base_version=1)
            await expect_error(
                stub_for(b.address).ReplicateCommit(commit, timeout=10),
                Code.FAILED_PRECONDITION, "UNKNOWN_EPOCH",
            )  # fmt: skip
            for replica, role in (
                (a, common.REPLICA_ROLE_PRIMARY),
                (b, common.REPLICA_ROLE_BACKUP),
            ):
                st = await status(stub_for(replica.address))
                assert (st.role, st.epoch) == (role, 1)
            assert await health_status(a.address) == health_pb2.HealthCheckResponse.SERVING

            # the primary goes on serving and replicating at its own epoch
            result = await client.push(JOB, 1, 0, 1, grads(1.0))
            assert (result.version, client.primary, client.epoch) == (2, a.address, 1)
            settled = await assert_same_state(stub_for, [a, b], JOB)
            assert settled.version == 2
            _, params = await pull_raw(stub_for(a.address), JOB, epoch=1)
            assert torch.equal(params["w"], initial()["w"] - 1.0)
        finally:
            await client.close()


async def _is(status_call, want: int) -> bool:
    return await status_call == want


async def test_a_primary_restarted_with_its_flags_cannot_wipe_its_backup(launcher) -> None:
    # Restarted at once under its old flags (same epoch, same backup), the primary
    # holds nothing; a trainer that finds the job gone registers it afresh there.
    b = launcher.start("b", "--role", "backup")
    primary_flags = ["--role", "primary", "--epoch", "1", "--backups", b.address]
    a = launcher.start("a", *primary_flags)
    header = model_header(JOB, initial(), sgd(0.5), consistency("sync"), num_slots=1)
    async with stubs() as stub_for:
        await register_raw(stub_for(a.address), header, initial())
        for step in range(3):
            await push_raw(stub_for(a.address), push_messages(JOB, step, 0, grads(1.0), step))
        before = await fingerprint(stub_for(b.address), JOB)
        port = a.address.rsplit(":", 1)[1]
        signal_group(a, signal.SIGKILL)
        a.popen.wait(30)
        again = launcher.start("a-again", *primary_flags, "--port", port)

        err = await expect_error(
            register_raw(stub_for(again.address), header, initial()),
            Code.UNAVAILABLE, "NO_INSYNC_BACKUP",
        )  # fmt: skip
        assert "no backup could take job" in err.message
        jobs = {j.job_id: j.version for j in (await status(stub_for(b.address))).jobs}
        assert jobs == {JOB: 3}  # the backup kept every acknowledged step
        assert await fingerprint(stub_for(b.address), JOB) == before
