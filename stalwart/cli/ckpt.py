"""``stalwart ckpt``: list, show, verify, restore and delete checkpoints.

Through the coordinator by default (``--coordinator``, or the local cluster).
``--store-url`` reads a checkpoint store directly instead (list/show/verify/rm,
no cluster needed: e.g. a durable ``file://`` tier); restoring always goes
through the coordinator, which owns the paramservers.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import typer

from stalwart.api import common
from stalwart.cli.output import (
    OUTPUT_OPTION,
    ExitCode,
    Output,
    cli_errors,
    emit,
    emit_record,
    emit_rows,
    fail,
)
from stalwart.cli.target import FROM_FLAGS, LongTarget, Target, option_groups
from stalwart.client.coordinator import CoordinatorClient
from stalwart.errors import ErrorKind, StalwartError

T = TypeVar("T")

app = typer.Typer(help="Checkpoints: list, show, verify, restore, rm.", no_args_is_help=True)

STORE_URL = typer.Option(
    "", "--store-url", envvar="STALWART_CHECKPOINT_URL",
    help="read this checkpoint store directly instead of asking the coordinator",
)  # fmt: skip
JOB = typer.Option("", "--job", "-j", help="only this job's checkpoints")


def _open(url: str):
    """The store ``url`` names, which must exist already: opening a new one makes it,
    and a command that only reads must not leave a store behind (a mistyped folder
    got a store's folders put into it)."""
    from stalwart.stores import open_store

    try:
        return open_store(url, existing=True)
    except StalwartError as exc:
        code = ExitCode.UNREACHABLE if exc.kind is ErrorKind.UNAVAILABLE else ExitCode.INVALID_INPUT
        fail(exc.message, code)


CHECKPOINT_ID = typer.Argument(..., help="checkpoint id, as `stalwart ckpt list` shows it")


def _job_of(checkpoint_id: str) -> str:
    parts = checkpoint_id.rsplit(".", 2)  # "<job>.s<step>.<hex>", as the coordinator names them
    if len(parts) != 3 or not parts[1].startswith("s"):
        fail(f"cannot tell the job of {checkpoint_id!r}; pass --job", ExitCode.INVALID_INPUT)
    return parts[0]


@dataclass(frozen=True)
class Source:
    """Where checkpoints are read: the store at --store-url, else the cluster's coordinator."""

    job: str = JOB
    store_url: str = STORE_URL
    cluster: Target = FROM_FLAGS

    def job_of(self, checkpoint_id: str) -> str:
        return self.job or _job_of(checkpoint_id)

    def ask(
        self,
        in_store: Callable[[Any, Any], T],
        via_coordinator: Callable[[CoordinatorClient], Awaitable[T]],
        checkpoint_id: str = "",
    ) -> T:
        """``in_store(ckpt, store)`` with --store-url, else ``via_coordinator(client)``,
        once ``checkpoint_id`` is found to be --job's (the coordinator finds a
        checkpoint by its id alone, and `rm -j` deleted another job's).

        ``ckpt`` is stalwart.checkpoint, imported only here: it imports torch (slow).
        """
        if not self.store_url:

            async def checked(client: CoordinatorClient) -> T:
                if self.job and checkpoint_id:
                    owner = (await client.get_checkpoint(checkpoint_id)).job_id
                    if owner != self.job:
                        raise StalwartError(
                            ErrorKind.INVALID_ARGUMENT,
                            f"checkpoint {checkpoint_id!r} belongs to job {owner!r}, not to "
                            f"{self.job!r} (--job); nothing was done",
                        )
                return await via_coordinator(client)

            return self.cluster.call(checked)
        from stalwart import checkpoint as ckpt

        with _open(self.store_url) as store:
            return in_store(ckpt, store)


@dataclass(frozen=True)
class _LongSource(Source):
    """A :class:`Source` whose coordinator call walks a whole checkpoint (verify reads
    every chunk, rm collects those nothing else references): it waits as a restore does."""

    cluster: LongTarget = FROM_FLAGS  # type: ignore[assignment] - a Target, with more time


def _age(manifest: common.CheckpointManifest, now: float) -> str:
    seconds = max(0.0, now - manifest.create_time.ToNanoseconds() / 1e9)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def _row(m: common.CheckpointManifest, now: float) -> list:
    ratio = m.written_bytes / m.total_bytes if m.total_bytes else 0.0
    return [m.checkpoint_id, m.job_id, m.step, f"{m.total_bytes / 2**20:.2f}",
            f"{m.written_bytes / 2**20:.3f}", f"{ratio:.1%}", m.parent_id or "-", _age(m, now)]  # fmt: skip


COLUMNS = ["id", "job", "step", "size MiB", "written MiB", "delta", "parent", "age"]


@app.command("list")
@cli_errors
@option_groups
def list_(source: Source = FROM_FLAGS, output: Output = OUTPUT_OPTION) -> None:
    """Complete checkpoints, newest first: size, written bytes (delta = written/total), age."""
    if source.store_url and not source.job:
        fail("--store-url needs --job (a store does not list jobs)", ExitCode.INVALID_INPUT)
    manifests = source.ask(
        lambda ckpt, store: ckpt.list_checkpoints(store, source.job)[0],
        lambda client: _all_checkpoints(client, source.job),
    )
    now = time.time()
    emit_rows(output, "checkpoints", COLUMNS, manifests, lambda m: _row(m, now), _summary)


async def _all_checkpoints(client: CoordinatorClient, job: str) -> list:
    jobs = [job] if job else [j.job_id for j in await client.all_jobs()]
    out = []
    for job_id in jobs:
        out += (await client.list_checkpoints(job_id)).checkpoints
    return out


def _summary(m: common.CheckpointManifest) -> dict:
    return {
        "checkpoint_id": m.checkpoint_id, "job_id": m.job_id, "step": m.step,
        "total_bytes": m.total_bytes, "written_bytes": m.written_bytes,
        "delta_ratio": round(m.written_bytes / m.total_bytes, 6) if m.total_bytes else 0.0,
        "parent_id": m.parent_id, "create_time": m.create_time.ToJsonString(),
        "store_url": m.store_url,
    }  # fmt: skip


def _details(m: common.CheckpointManifest) -> dict:
    return {
        **_summary(m),
        "data position": f"step {m.data_position.step}, seed {m.data_position.seed}",
        "shards": ", ".join(f"{s.shard}@v{s.version}" for s in m.shards),
        "tensors": len(m.tensors),
        "chunks": sum(len(t.chunks) for t in m.tensors),
        "patched chunks": sum(1 for t in m.tensors for r in t.chunks if r.patch_hash),
    }


@app.command()
@cli_errors
@option_groups
def show(
    checkpoint_id: str = CHECKPOINT_ID, source: Source = FROM_FLAGS, output: Output = OUTPUT_OPTION
) -> None:
    """One checkpoint: its manifest (tensors, shards, data position)."""
    m = source.ask(
        lambda ckpt, store: ckpt.load_manifest(store, source.job_of(checkpoint_id), checkpoint_id),
        lambda client: client.get_checkpoint(checkpoint_id),
        checkpoint_id,
    )
    emit_record(output, f"checkpoint {m.checkpoint_id}", m, _details)


@app.command()
@cli_errors
@option_groups
def create(
    job: str = typer.Argument(..., help="a running job's id, as `stalwart jobs` shows it"),
    cluster: LongTarget = FROM_FLAGS,
    output: Output = OUTPUT_OPTION,
) -> None:
    """Checkpoint a running job now, as its --checkpoint-interval would; prints the manifest."""
    m = cluster.call(lambda c: c.create_checkpoint(job), f"checkpointing {job}")
    emit_record(output, f"checkpoint {m.checkpoint_id}", m, _details)


@app.command()
@cli_errors
@option_groups
def verify(
    checkpoint_id: str = CHECKPOINT_ID,
    source: _LongSource = FROM_FLAGS,
    output: Output = OUTPUT_OPTION,
) -> None:
    """Read every chunk and check size, CRC32C and SHA-256 (exit 1 if any is bad)."""
    result = source.ask(
        lambda ckpt, store: _verify_in_store(
            ckpt, store, source.job_of(checkpoint_id), checkpoint_id
        ),
        lambda client: _verify_via_coordinator(client, checkpoint_id),
        checkpoint_id,
    )
    emit_record(output, f"verify {checkpoint_id}", result)
    if not result["ok"]:
        raise typer.Exit(int(ExitCode.FAILED))


def _verify_in_store(ckpt, store, job: str, checkpoint_id: str) -> dict:
    report = ckpt.verify(store, ckpt.load_manifest(store, job, checkpoint_id))
    return {"checkpoint_id": checkpoint_id, "ok": report.ok, "chunks_checked": report.chunks,
            "problems": report.problems}  # fmt: skip


async def _verify_via_coordinator(client: CoordinatorClient, checkpoint_id: str) -> dict:
    resp = await client.verify_checkpoint(checkpoint_id)
    return {"checkpoint_id": checkpoint_id, "ok": resp.ok,
            "chunks_checked": resp.chunks_checked, "problems": list(resp.problems)}  # fmt: skip


@app.command()
@cli_errors
@option_groups
def restore(
    checkpoint_id: str, cluster: LongTarget = FROM_FLAGS, output: Output = OUTPUT_OPTION
) -> None:
    """Load a checkpoint into the job's paramservers; the job goes on from its step."""
    job = cluster.call(lambda c: c.restore_checkpoint(checkpoint_id), f"restoring {checkpoint_id}")
    emit(
        output,
        job,
        lambda: print(f"job {job.job_id} restored from {checkpoint_id}: now at step {job.step}"),
    )


@app.command("rm")
@cli_errors
@option_groups
def rm(
    checkpoint_id: str = CHECKPOINT_ID,
    source: _LongSource = FROM_FLAGS,
    output: Output = OUTPUT_OPTION,
) -> None:
    """Delete a checkpoint and the chunks nothing else references (no delta depends on it)."""
    collected = source.ask(
        lambda ckpt, store: ckpt.delete_checkpoint(
            store, source.job_of(checkpoint_id), checkpoint_id
        ),
        lambda client: client.delete_checkpoint(checkpoint_id),
        checkpoint_id,
    )
    emit(
        output,
        {"checkpoint_id": checkpoint_id, "chunks_collected": collected},
        lambda: print(f"deleted {checkpoint_id}; {collected} chunk(s) collected"),
    )
