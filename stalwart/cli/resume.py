"""``stalwart job resume JOB``: continue a job from its newest complete checkpoint.

Meant for after a full stop (``stalwart down``, then ``stalwart up`` on the same
durable store, ``--store-url file://DIR``): the job and its checkpoints are in
the store, its paramservers are new and empty. The newest checkpoint that
verifies is loaded into the job's shard groups (RestoreCheckpoint, which
checks every chunk first) and training goes on from its step; in sync mode the
result is bitwise that of an uninterrupted run. A corrupt checkpoint is
skipped for the next older one.

:func:`candidates` decides (pure, unit-tested); :func:`resume_job` calls.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence

import grpc
import typer

from stalwart.api import coordinator
from stalwart.cli.admin import enum_name
from stalwart.cli.output import OUTPUT_OPTION, ExitCode, Output, cli_errors, emit_record, fail
from stalwart.cli.target import FROM_FLAGS, Target, option_groups
from stalwart.client.coordinator import CoordinatorClient
from stalwart.errors import ErrorKind, RpcError

RETRY_PAUSE_S = 1.0  # between attempts while the new paramservers are not yet polled
RESTORE_CALL_S = 60.0  # one RestoreCheckpoint attempt: it promotes and loads before answering
# Worth another try with the same request id: no leader right now (an election after
# `up`), no replica to restore onto yet, or an attempt that ran out of time.
_AGAIN = {ErrorKind.UNAVAILABLE, ErrorKind.NOT_LEADER, ErrorKind.DEADLINE_EXCEEDED}
HINT_DURABLE = (
    "a job outlives `stalwart down` only in a durable store: stalwart up --store-url file://DIR"
)


class CannotResume(Exception):
    """The job cannot be resumed; the message says why and what to do."""


def candidates(
    job_id: str, state: str, step: int, checkpoints: Sequence[tuple[str, int]]
) -> list[tuple[str, int]]:
    """The (checkpoint id, step) pairs to try, newest first (ties: the later id).

    ``state`` is the job's state name (``running``, ``succeeded``...). Raises
    CannotResume for a finished job or one with no complete checkpoint.
    """
    if state == "succeeded":
        raise CannotResume(f"job {job_id} already succeeded at step {step}: nothing to resume")
    if state in ("failed", "cancelled"):
        raise CannotResume(
            f"job {job_id} is {state}, which is final: export its weights (stalwart job "
            "export) and submit a new job with --init-from"
        )
    if not checkpoints:
        raise CannotResume(
            f"job {job_id} has no complete checkpoint to resume from (submit jobs with "
            f"--checkpoint-interval N; {HINT_DURABLE})"
        )
    return sorted(checkpoints, key=lambda c: (c[1], c[0]), reverse=True)


async def resume_job(client: CoordinatorClient, job_id: str, timeout_s: float) -> dict:
    """Restore the newest checkpoint of ``job_id`` that verifies; what was done, as a dict."""
    try:
        job = await client.get_job(job_id)
    except RpcError as err:
        if err.kind in (ErrorKind.UNKNOWN_JOB, ErrorKind.NOT_FOUND):
            raise CannotResume(
                f"no job {job_id!r} in this cluster's store ({HINT_DURABLE})"
            ) from None
        raise
    listing = await client.list_checkpoints(job_id)
    state = enum_name(coordinator.JobState, job.state, "JOB_STATE_")
    order = candidates(job_id, state, job.step,
                       [(m.checkpoint_id, m.step) for m in listing.checkpoints])  # fmt: skip
    skipped: list[str] = []
    request_id = uuid.uuid4().hex  # one per command: a retry of it never restores twice
    deadline = time.monotonic() + timeout_s
    for checkpoint_id, ckpt_step in order:
        try:
            restored = await _restore(client, checkpoint_id, request_id, deadline)
        except RpcError as err:
            if err.code != grpc.StatusCode.DATA_LOSS:  # missing or corrupt: the next older
                raise
            skipped.append(f"{checkpoint_id}: {err.message}")
            request_id = uuid.uuid4().hex
            continue
        return {"job": job_id, "checkpoint": checkpoint_id, "step": ckpt_step,
                "step_before": job.step, "state": enum_name(
                    coordinator.JobState, restored.state, "JOB_STATE_"),
                "skipped": skipped}  # fmt: skip
    raise CannotResume(f"every checkpoint of job {job_id} is corrupt: {'; '.join(skipped)}")


async def _restore(
    client: CoordinatorClient, checkpoint_id: str, request_id: str, deadline: float
) -> coordinator.Job:
    """RestoreCheckpoint, retried under one request id (a retry never restores twice)
    while the answer is worth waiting for: right after ``up`` the leader may not yet
    have polled the new paramservers it restores onto, or not be elected yet."""
    while True:
        left = deadline - time.monotonic()
        try:
            return await client.restore_checkpoint(
                checkpoint_id, request_id, timeout_s=max(1.0, min(RESTORE_CALL_S, left))
            )
        except RpcError as err:
            if err.kind not in _AGAIN or time.monotonic() >= deadline:
                raise
        await asyncio.sleep(RETRY_PAUSE_S)


@cli_errors
@option_groups
def resume(
    job_id: str = typer.Argument(..., help="job id"),
    restore_wait: float = typer.Option(120.0, min=1, help="longest wait for paramservers to restore onto, seconds"),
    output: Output = OUTPUT_OPTION,
    cluster: Target = FROM_FLAGS,
) -> None:  # fmt: skip
    """Continue a job from its newest complete checkpoint (after `stalwart down` and `up`
    on the same durable store); a job past that checkpoint goes back to it."""

    async def go(client: CoordinatorClient) -> dict:
        try:
            return await resume_job(client, job_id, restore_wait)
        except CannotResume as exc:
            fail(str(exc), ExitCode.INVALID_INPUT)
            raise  # not reached: fail() exits

    emit_record(output, f"resumed {job_id}", cluster.call(go))
