"""``stalwart ckpt``: list, show, verify, restore and delete checkpoints.

Through the coordinator by default (``--coordinator``, or the local cluster).
``--store-url`` reads a checkpoint store directly instead (list/show/verify/rm,
no cluster needed: e.g. a durable ``file://`` tier); restoring always goes
through the coordinator, which owns the paramservers.
"""

from __future__ import annotations

import time
from pathlib import Path

import typer

from stalwart.api import common
from stalwart.cli import target
from stalwart.cli.output import (
    OUTPUT_OPTION,
    ExitCode,
    Output,
    cli_errors,
    emit_json,
    emit_mapping,
    emit_table,
    fail,
)
from stalwart.errors import ErrorKind, StalwartError

app = typer.Typer(help="Checkpoints: list, show, verify, restore, rm.", no_args_is_help=True)

STORE_URL = typer.Option(
    "", "--store-url", envvar="STALWART_CHECKPOINT_URL",
    help="read this checkpoint store directly instead of asking the coordinator",
)  # fmt: skip
JOB = typer.Option("", "--job", "-j", help="only this job's checkpoints")


def _open(url: str):
    from stalwart.stores import open_store

    try:
        return open_store(url)
    except StalwartError as exc:
        code = ExitCode.UNREACHABLE if exc.kind is ErrorKind.UNAVAILABLE else ExitCode.INVALID_INPUT
        fail(exc.message, code)


def _job_of(checkpoint_id: str) -> str:
    parts = checkpoint_id.rsplit(".", 2)  # "<job>.s<step>.<hex>", as the coordinator names them
    if len(parts) != 3 or not parts[1].startswith("s"):
        fail(f"cannot tell the job of {checkpoint_id!r}; pass --job", ExitCode.INVALID_INPUT)
    return parts[0]


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
def list_(
    job: str = JOB,
    store_url: str = STORE_URL,
    coordinator: str = target.COORDINATOR,
    run_dir: Path = target.RUN_DIR,
    timeout: float = target.TIMEOUT,
    output: Output = OUTPUT_OPTION,
) -> None:
    """Complete checkpoints, newest first: size, written bytes (delta = written/total), age."""
    if store_url:
        if not job:
            fail("--store-url needs --job (a store does not list jobs)", ExitCode.INVALID_INPUT)
        from stalwart import checkpoint as ckpt

        with _open(store_url) as store:
            manifests = ckpt.list_checkpoints(store, job)[0]
    else:

        async def fetch(client):
            jobs = [job] if job else [j.job_id for j in await client.all_jobs()]
            out = []
            for job_id in jobs:
                out += (await client.list_checkpoints(job_id)).checkpoints
            return out

        manifests = target.call(coordinator, run_dir, timeout, fetch)
    if output is Output.json:
        return emit_json([_summary(m) for m in manifests])
    now = time.time()
    emit_table("checkpoints", COLUMNS, [_row(m, now) for m in manifests])


def _summary(m: common.CheckpointManifest) -> dict:
    return {
        "checkpoint_id": m.checkpoint_id, "job_id": m.job_id, "step": m.step,
        "total_bytes": m.total_bytes, "written_bytes": m.written_bytes,
        "delta_ratio": round(m.written_bytes / m.total_bytes, 6) if m.total_bytes else 0.0,
        "parent_id": m.parent_id, "create_time": m.create_time.ToJsonString(),
        "store_url": m.store_url,
    }  # fmt: skip


def _manifest(checkpoint_id: str, job: str, store_url: str, coordinator, run_dir, timeout):
    if store_url:
        from stalwart import checkpoint as ckpt

        with _open(store_url) as store:
            return ckpt.load_manifest(store, job or _job_of(checkpoint_id), checkpoint_id)
    return target.call(coordinator, run_dir, timeout, lambda c: c.get_checkpoint(checkpoint_id))


@app.command()
@cli_errors
def show(
    checkpoint_id: str,
    job: str = JOB,
    store_url: str = STORE_URL,
    coordinator: str = target.COORDINATOR,
    run_dir: Path = target.RUN_DIR,
    timeout: float = target.TIMEOUT,
    output: Output = OUTPUT_OPTION,
) -> None:
    """One checkpoint: its manifest (tensors, shards, data position)."""
    m = _manifest(checkpoint_id, job, store_url, coordinator, run_dir, timeout)
    if output is Output.json:
        return emit_json(m)
    emit_mapping(f"checkpoint {m.checkpoint_id}", {
        **{k: v for k, v in _summary(m).items()},
        "data position": f"step {m.data_position.step}, seed {m.data_position.seed}",
        "shards": ", ".join(f"{s.shard}@v{s.version}" for s in m.shards),
        "tensors": len(m.tensors),
        "chunks": sum(len(t.chunks) for t in m.tensors),
        "patched chunks": sum(1 for t in m.tensors for r in t.chunks if r.patch_hash),
    })  # fmt: skip


@app.command()
@cli_errors
def verify(
    checkpoint_id: str,
    job: str = JOB,
    store_url: str = STORE_URL,
    coordinator: str = target.COORDINATOR,
    run_dir: Path = target.RUN_DIR,
    timeout: float = target.TIMEOUT,
    output: Output = OUTPUT_OPTION,
) -> None:
    """Read every chunk and check size, CRC32C and SHA-256 (exit 1 if any is bad)."""
    if store_url:
        from stalwart import checkpoint as ckpt

        with _open(store_url) as store:
            m = ckpt.load_manifest(store, job or _job_of(checkpoint_id), checkpoint_id)
            report = ckpt.verify(store, m)
        result = {"checkpoint_id": checkpoint_id, "ok": report.ok, "chunks_checked": report.chunks,
                  "problems": report.problems}  # fmt: skip
    else:
        resp = target.call(
            coordinator, run_dir, timeout, lambda c: c.verify_checkpoint(checkpoint_id)
        )
        result = {"checkpoint_id": checkpoint_id, "ok": resp.ok,
                  "chunks_checked": resp.chunks_checked, "problems": list(resp.problems)}  # fmt: skip
    if output is Output.json:
        emit_json(result)
    else:
        emit_mapping(f"verify {checkpoint_id}", result)
    if not result["ok"]:
        raise typer.Exit(int(ExitCode.FAILED))


@app.command()
@cli_errors
def restore(
    checkpoint_id: str,
    coordinator: str = target.COORDINATOR,
    run_dir: Path = target.RUN_DIR,
    timeout: float = typer.Option(120.0, "--timeout", min=0.1, help="seconds to wait"),
    output: Output = OUTPUT_OPTION,
) -> None:
    """Load a checkpoint into the job's paramservers; the job goes on from its step."""
    job = target.call(coordinator, run_dir, timeout, lambda c: _restore(c, checkpoint_id, timeout))
    if output is Output.json:
        return emit_json(job)
    print(f"job {job.job_id} restored from {checkpoint_id}: now at step {job.step}")


async def _restore(client, checkpoint_id: str, timeout: float):
    client.call_timeout_s = timeout  # a restore reads the whole checkpoint: longer than a call
    return await client.restore_checkpoint(checkpoint_id)


@app.command("rm")
@cli_errors
def rm(
    checkpoint_id: str,
    job: str = JOB,
    store_url: str = STORE_URL,
    coordinator: str = target.COORDINATOR,
    run_dir: Path = target.RUN_DIR,
    timeout: float = target.TIMEOUT,
    output: Output = OUTPUT_OPTION,
) -> None:
    """Delete a checkpoint and the chunks nothing else references (no delta depends on it)."""
    if store_url:
        from stalwart import checkpoint as ckpt

        with _open(store_url) as store:
            collected = ckpt.delete_checkpoint(store, job or _job_of(checkpoint_id), checkpoint_id)
    else:
        collected = target.call(
            coordinator, run_dir, timeout, lambda c: c.delete_checkpoint(checkpoint_id)
        )
    if output is Output.json:
        return emit_json({"checkpoint_id": checkpoint_id, "chunks_collected": collected})
    print(f"deleted {checkpoint_id}; {collected} chunk(s) collected")
