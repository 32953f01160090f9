"""SaveCheckpoint / LoadCheckpoint for one replica, over :mod:`stalwart.checkpoint`.

Save: wait for the job to reach the asked version, copy its state in memory
under the job's lock (the only moment training is held: ``snapshot_seconds``),
release the lock, and upload the copy from a worker thread while pushes go on.
The answer is this shard's part of the manifest; whoever gathers every
shard's part (the coordinator) publishes the manifest, so a checkpoint is
visible only once all its chunks are stored.

Load: read and verify every chunk of this shard first; only then replace the
job's state, through the same path InstallState takes, and re-install it on
the backups. A bad chunk answers DATA_LOSS with nothing changed.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import structlog
import torch

from services.paramserver.job import Entry, JobModel
from services.paramserver.runtime import JobHost, JobRuntime
from stalwart import checkpoint as ckpt
from stalwart import codec
from stalwart.api import common, paramserver
from stalwart.errors import ErrorKind, StalwartError
from stalwart.stores import parse_store_url

log = structlog.get_logger(__name__)

# Test-only: seconds to sleep before each chunk is stored, so a test can kill
# the process in the middle of an upload. Never set in production.
_PUT_DELAY_ENV = "STALWART_TEST_CHECKPOINT_PUT_DELAY"

# One store connection per URL for the whole process.
STORES = ckpt.StorePool()
# Uploads run here, not on the default executor the optimizer uses, and one at
# a time: a second upload would only compete for the same cores and link.
_UPLOADS = ThreadPoolExecutor(1, thread_name_prefix="checkpoint-upload")


def finish_uploads() -> None:
    """At exit: wait for an upload or checkpoint read still running, then end the thread."""
    _UPLOADS.shutdown(wait=True)


@dataclass
class Snapshot:
    """A private copy of one job's state at one version."""

    header: paramserver.ModelHeader
    params: tuple[str, ...]
    tensors: dict[str, torch.Tensor]
    version: int
    applied: list[Entry]
    clocks: list[int]


# The buffers of each job's last uploaded snapshot, reused by the next one:
# copying into pages already mapped is several times faster than into fresh
# ones (no page faults), and the copy is the time training is held. Costs one
# copy of the job's state in memory between checkpoints.
_SPARE: dict[str, dict[str, torch.Tensor]] = {}

# Per job, the chunks last stored whole: later checkpoints store a changed
# chunk as a patch of its changed rows against them (row-level deltas, see
# stalwart.checkpoint.PatchBase). Costs one more copy of the job's state in
# memory; a replica that starts empty (restart, promotion) writes whole chunks
# on its first checkpoint and patches from the next one on.
_BASES: dict[str, ckpt.PatchBase] = {}


def forget(job_id: str) -> None:
    """Drop what this replica keeps between a job's checkpoints (its model deleted):
    kept, two copies of each deleted job's state stayed in memory for good."""
    _SPARE.pop(job_id, None)
    _BASES.pop(job_id, None)


def take_snapshot(model: JobModel) -> Snapshot:
    """Copy parameters and optimizer state (the caller holds the job's lock)."""
    spare = _SPARE.pop(model.job_id, {})
    tensors = {}
    for name, t in model.state_tensors().items():
        buf = spare.get(name)
        if buf is not None and buf.shape == t.shape and buf.dtype == t.dtype:
            tensors[name] = buf.copy_(t)
        else:
            tensors[name] = t.detach().clone()
    return Snapshot(
        header=model.header,
        params=tuple(model.params),
        tensors=tensors,
        version=model.version,
        applied=[Entry(s, k, c) for (s, k), c in model.applied.items()],
        clocks=list(model.clocks),
    )


def _put_delay():
    delay = float(os.environ.get(_PUT_DELAY_ENV, "0") or 0)
    return (lambda _hash: time.sleep(delay)) if delay > 0 else None


def upload(
    snapshot: Snapshot, shard: int, store_url: str, job_id: str, parent_id: str, chunk_bytes: int
) -> tuple[list[common.CheckpointTensor], ckpt.WriteStats]:
    """Store the snapshot's chunks (blocking; runs on the upload thread)."""
    store = STORES.get(store_url)
    skip: set[str] = set()
    if parent_id:
        try:
            skip = ckpt.chunk_hashes(ckpt.load_manifest(store, job_id, parent_id).tensors)
        except StalwartError as exc:
            # Content addressing still dedupes through has_chunk; the parent
            # only spares the round trips, so its absence costs time, not data.
            log.warning("parent checkpoint unreadable", parent=parent_id, error=str(exc))
    items = ckpt.state_items(
        snapshot.tensors, snapshot.params, shard, buffers=set(snapshot.header.buffer_names)
    )
    ckpt.require_room(store, job_id, sum(i.tensor.numel() * i.tensor.element_size() for i in items))
    return ckpt.write_tensors(
        store, items, chunk_bytes=chunk_bytes, skip=skip, before_put=_put_delay(),
        patch_base=_BASES.setdefault(job_id, ckpt.PatchBase()),
    )  # fmt: skip


def shard_state(shard: int, snapshot: Snapshot) -> common.ShardState:
    return common.ShardState(
        shard=shard,
        version=snapshot.version,
        applied=[e.to_proto() for e in snapshot.applied],
        slot_clocks=snapshot.clocks,
    )


def _check_request_names(job_id: str, checkpoint_id: str, store_url: str) -> None:
    if not job_id:
        raise StalwartError(ErrorKind.INVALID_ARGUMENT, "job_id is empty")
    if not checkpoint_id:
        raise StalwartError(ErrorKind.INVALID_ARGUMENT, "checkpoint_id is empty")
    parse_store_url(store_url)  # INVALID_ARGUMENT for a bad URL, before any waiting


async def save(host: JobHost, request: paramserver.SaveCheckpointRequest, context):
    host.check_client(request.epoch)
    _check_request_names(request.job_id, request.checkpoint_id, request.store_url)
    chunk_bytes = ckpt.check_chunk_bytes(request.chunk_size)
    reach = _reach_timeout(request.reach_timeout_seconds)
    job = host.job(request.job_id)
    loop = asyncio.get_running_loop()
    # open (connect) before taking the lock: an unreachable store fails fast. Not on
    # _UPLOADS: behind the last save's upload, this save would reach the lock late
    # and find the job past the version it was aimed at.
    await loop.run_in_executor(None, STORES.get, request.store_url)
    timeout = context.time_remaining() or host.sync_wait_s
    bounded = 0 < reach < timeout  # the caller asked to hear back before its deadline
    async with job.lock:
        _refuse_if_past(job, request.at_version)
        try:
            await asyncio.wait_for(
                job.committed.wait_for(lambda: job.model.version >= request.at_version),
                reach if bounded else timeout,
            )
        except TimeoutError:
            # within the asked reach: the caller aims again (a job that stopped moving
            # is snapshot where it stands); at the call's deadline: it gave up
            kind = ErrorKind.FAILED_PRECONDITION if bounded else ErrorKind.DEADLINE_EXCEEDED
            within = f" within {reach:g}s" if bounded else ""
            raise StalwartError(
                kind,
                f"version {request.at_version} not reached{within} (at {job.model.version})",
            ) from None
        _refuse_if_past(job, request.at_version)  # another commit got the lock first
        held = time.perf_counter()
        snapshot = await loop.run_in_executor(None, take_snapshot, job.model)
        snapshot_seconds = time.perf_counter() - held
    started = time.perf_counter()
    tensors, stats = await loop.run_in_executor(
        _UPLOADS,
        upload,
        snapshot,
        host.shard,
        request.store_url,
        request.job_id,
        request.parent_id,
        chunk_bytes,
    )
    upload_seconds = time.perf_counter() - started
    _SPARE[request.job_id] = snapshot.tensors  # uploaded: its buffers serve the next one
    log.info(
        "checkpoint uploaded",
        job=request.job_id,
        checkpoint=request.checkpoint_id,
        version=snapshot.version,
        written_chunks=stats.written_chunks,
        total_chunks=stats.total_chunks,
        snapshot_seconds=round(snapshot_seconds, 4),
        upload_seconds=round(upload_seconds, 3),
    )
    return paramserver.SaveCheckpointResponse(
        shard=shard_state(host.shard, snapshot),
        tensors=tensors,
        total_bytes=stats.total_bytes,
        written_bytes=stats.written_bytes,
        snapshot_seconds=snapshot_seconds,
        upload_seconds=upload_seconds,
        consistency=snapshot.header.consistency,
        num_slots=snapshot.header.num_slots,
    )


def _reach_timeout(seconds: float) -> float:
    if not math.isfinite(seconds) or seconds < 0:
        raise StalwartError(
            ErrorKind.INVALID_ARGUMENT,
            f"reach_timeout_seconds must be a finite number >= 0, got {seconds}",
        )
    return seconds


def _refuse_if_past(job: JobRuntime, at_version: int) -> None:
    if job.model.version > at_version:
        raise StalwartError(
            ErrorKind.FAILED_PRECONDITION,
            f"job is at version {job.model.version}, past the asked {at_version}",
        )


# --- load -----------------------------------------------------------------------------


def model_from_checkpoint(
    manifest: common.CheckpointManifest,
    shard: int,
    tensors: dict[str, torch.Tensor],
    epoch: int,
) -> JobModel:
    """The JobModel a checkpoint describes, built as InstallState builds one."""
    state = next((s for s in manifest.shards if s.shard == shard), None)
    if state is None:
        raise StalwartError(
            ErrorKind.INVALID_ARGUMENT,
            f"checkpoint {manifest.checkpoint_id} has no counters for shard {shard}",
        )
    mine = [t for t in manifest.tensors if t.shard == shard]
    params = [t.spec for t in mine if t.kind in (ckpt.KIND_PARAM, ckpt.KIND_BUFFER)]
    header = paramserver.ModelHeader(
        buffer_names=[t.spec.name for t in mine if t.kind == ckpt.KIND_BUFFER],
        job_id=manifest.job_id,
        optimizer=manifest.optimizer,
        consistency=manifest.consistency,
        num_slots=manifest.num_slots,
        epoch=epoch,
        tensors=params,
        gradient_dtype=manifest.gradient_dtype,
    )
    install = paramserver.InstallStateHeader(
        epoch=epoch,
        model=header,
        version=state.version,
        tensors=[t.spec for t in mine],
        applied=state.applied,
        slot_clocks=state.slot_clocks,
    )
    return JobModel.from_install(install, tensors)


def _shard_tensors(manifest: common.CheckpointManifest, shard: int, limits: codec.Limits):
    """The shard's tensors; none is fine for a shard the manifest has counters of (a
    model with fewer tensors than shard groups leaves a group nothing to hold)."""
    mine = [t for t in manifest.tensors if t.shard == shard]
    if not mine and not any(s.shard == shard for s in manifest.shards):
        raise StalwartError(
            ErrorKind.INVALID_ARGUMENT,
            f"checkpoint {manifest.checkpoint_id} holds nothing of shard {shard}",
        )
    codec.validate_specs([t.spec for t in mine], limits)  # limits before allocating
    return mine


async def load(host: JobHost, request: paramserver.LoadCheckpointRequest, context):
    host.check_client(request.epoch)
    manifest = request.manifest
    if request.job_id != manifest.job_id:
        raise StalwartError(
            ErrorKind.INVALID_ARGUMENT,
            f"manifest is of job {manifest.job_id!r}, request names {request.job_id!r}",
        )
    if request.shard != host.shard:
        raise StalwartError(
            ErrorKind.INVALID_ARGUMENT,
            f"this replica serves shard {host.shard}, the request names shard {request.shard}",
        )
    url = request.store_url or manifest.store_url
    _check_request_names(request.job_id, manifest.checkpoint_id, url)
    mine = _shard_tensors(manifest, host.shard, host.limits)
    loop = asyncio.get_running_loop()

    def read_and_build():
        tensors, stats = ckpt.read_tensors(STORES.get(url), mine)  # DATA_LOSS: nothing changed
        return model_from_checkpoint(manifest, host.shard, tensors, host.replica.epoch), stats

    model, stats = await loop.run_in_executor(_UPLOADS, read_and_build)
    job = await host.replace(model, "restored from a checkpoint")
    log.warning(
        "state restored from checkpoint",
        job=model.job_id,
        checkpoint=manifest.checkpoint_id,
        version=model.version,
        bytes=stats.bytes,
    )
    return paramserver.LoadCheckpointResponse(version=job.model.version, bytes_read=stats.bytes)
