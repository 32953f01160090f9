"""Checkpoints in a store: content-addressed chunks first, the manifest last.

A checkpoint is a set of named tensors cut into chunks (4 MiB by default).
Each chunk is stored under the SHA-256 of its bytes and listed in the manifest
with its size and CRC32C. Writing skips chunks the store already holds or the
parent checkpoint lists, so a delta checkpoint costs only the chunks that
changed. The manifest is published last and atomically (the store's
guarantee), after checking every chunk it lists is there: a checkpoint is
complete or invisible (DESIGN.md invariant 5). Reading checks every chunk's
size, CRC32C and SHA-256 before a byte of it is used; a missing or corrupt
chunk raises DATA_LOSS naming it.

Blocking code: call it from a worker thread, never on an event loop.
Decisions (which checkpoints to keep, which chunks are garbage, which
checkpoints go to the durable tier) live in :mod:`stalwart.retention`.
"""

from __future__ import annotations

import functools
import hashlib
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import structlog
from google.protobuf import message as pb_message
from google.protobuf import timestamp_pb2
from prometheus_client import Counter

from stalwart import chunkpatch, wiredtypes
from stalwart.api import common
from stalwart.errors import ErrorKind, StalwartError
from stalwart.retention import CheckpointInfo, RetentionPolicy, newest_first, unreferenced_chunks
from stalwart.stores import Store, crc32c, open_store

# torch (and stalwart.codec, which maps wire dtypes to torch's) only where tensors
# are made or read: the coordinator checks manifests, and its image has no torch.
if TYPE_CHECKING:
    import torch

log = structlog.get_logger(__name__)

DEFAULT_CHUNK_BYTES = 4 * 1024 * 1024
MIN_CHUNK_BYTES = 4 * 1024
MAX_CHUNK_BYTES = 256 * 1024 * 1024  # stores refuse values over 512 MiB
KIND_PARAM = "param"
KIND_BUFFER = "buffer"  # a module buffer (ModelHeader.buffer_names), kept beside the params
# Chunks in flight per transfer: enough to overlap hashing with store I/O on
# two cores, few enough that memory stays at a handful of chunks.
DEFAULT_WORKERS = 2

CORRUPT_CHECKPOINTS = Counter(
    "stalwart_checkpoints_corrupt_total",
    "Checkpoints skipped because a chunk was missing or corrupt, or the manifest unreadable.",
)
CHUNKS_WRITTEN = Counter("stalwart_checkpoint_chunks_written_total", "Checkpoint chunks stored.")
CHUNKS_REUSED = Counter(
    "stalwart_checkpoint_chunks_reused_total",
    "Checkpoint chunks not written because the store or the parent already held them.",
)


# --- writing ------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorItem:
    """One tensor to checkpoint. ``kind`` is "param" or the optimizer state name."""

    name: str
    tensor: torch.Tensor
    kind: str = KIND_PARAM
    shard: int = 0


@dataclass
class WriteStats:
    """What one write cost: every chunk counted once per reference."""

    total_chunks: int = 0
    written_chunks: int = 0  # whole chunks and patches stored
    total_bytes: int = 0
    written_bytes: int = 0
    seconds: float = 0.0
    patched_chunks: int = 0  # of written_chunks, those stored as a patch

    @property
    def reused_chunks(self) -> int:
        return self.total_chunks - self.written_chunks

    @property
    def size_ratio(self) -> float:
        """Full size over written size: how much smaller than a full checkpoint."""
        return self.total_bytes / self.written_bytes if self.written_bytes else float("inf")


@dataclass
class PatchBase:
    """Whole chunks a writer may store later chunks as patches against (row-level deltas).

    The writer keeps it in memory between checkpoints of one job: for every
    place (shard, tensor, byte offset) the hash and bytes of the chunk last
    stored *whole* there. A later chunk at that place whose changed blocks make
    a patch of at most ``max_fraction`` of the chunk is stored as that patch;
    otherwise it is stored whole and becomes the new base. Patches are
    cumulative against the base (not chained through parents), so reading
    needs two blobs at most, and deleting any checkpoint breaks no other: the
    manifests list the bases they patch, so retention keeps them.
    """

    block_bytes: int = chunkpatch.DEFAULT_BLOCK_BYTES
    max_fraction: float = 0.5
    chunks: dict[tuple[int, str, int], tuple[str, bytes]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        chunkpatch.check_block_bytes(self.block_bytes)


def stored_keys(ref: common.ChunkRef) -> tuple[str, ...]:
    """The store entries a chunk reference needs: the chunk, or its base and patch."""
    return (ref.base_hash, ref.patch_hash) if ref.patch_hash else (ref.hash,)


def check_chunk_bytes(chunk_bytes: int) -> int:
    chunk_bytes = chunk_bytes or DEFAULT_CHUNK_BYTES
    if not MIN_CHUNK_BYTES <= chunk_bytes <= MAX_CHUNK_BYTES:
        raise StalwartError(
            ErrorKind.INVALID_ARGUMENT,
            f"chunk size must be in [{MIN_CHUNK_BYTES}, {MAX_CHUNK_BYTES}] bytes, got {chunk_bytes}",
        )
    return chunk_bytes


def write_tensors(
    store: Store,
    items: Sequence[TensorItem],
    *,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    skip: Collection[str] = (),
    workers: int = DEFAULT_WORKERS,
    before_put: Callable[[str], None] | None = None,
    patch_base: PatchBase | None = None,
) -> tuple[list[common.CheckpointTensor], WriteStats]:
    """Store the tensors' chunks; return their CheckpointTensors and the cost.

    A chunk is not written when its hash is in ``skip`` (the parent's stored
    keys: no round trip needed), was written earlier in this call, or the
    store already has it. With ``patch_base`` a changed chunk may be stored as
    a patch against the base chunk at its place (see :class:`PatchBase`, which
    this call updates). The tensors must not change during the call: pass a
    snapshot. ``before_put`` is called with each key about to be written
    (tests use it to slow an upload down).
    """
    from stalwart import codec

    chunk_bytes = check_chunk_bytes(chunk_bytes)
    started = time.perf_counter()
    writer = _ChunkWriter(store, skip, before_put, patch_base)
    out = [
        common.CheckpointTensor(
            spec=codec.spec_of(item.name, item.tensor), shard=item.shard, kind=item.kind
        )
        for item in items
    ]
    views = [codec.byte_view(item.tensor) for item in items]
    pieces = [  # (tensor's index, place, bytes)
        (index, (item.shard, item.name, offset), view[offset : offset + chunk_bytes])
        for index, (item, view) in enumerate(zip(items, views, strict=True))
        for offset in range(0, len(view), chunk_bytes)
    ]
    stats = WriteStats()
    results = _bounded_map(lambda piece: writer.write(piece[1], piece[2]), pieces, workers)
    for (index, _, _), (ref, written, patched) in zip(pieces, results, strict=True):
        out[index].chunks.append(ref)
        stats.total_chunks += 1
        stats.total_bytes += ref.size
        if written:
            stats.written_chunks += 1
            stats.written_bytes += written
            stats.patched_chunks += patched
    stats.seconds = time.perf_counter() - started
    CHUNKS_WRITTEN.inc(stats.written_chunks)
    CHUNKS_REUSED.inc(stats.reused_chunks)
    return out, stats


class _ChunkWriter:
    """Stores one call's chunks from several threads: each distinct chunk once, and
    none the store (or ``skip``) already holds; a changed chunk as a patch against
    its base where ``patch_base`` allows."""

    def __init__(
        self,
        store: Store,
        skip: Collection[str],
        before_put: Callable[[str], None] | None,
        patch_base: PatchBase | None,
    ) -> None:
        self.store = store
        self.before_put = before_put
        self.patch_base = patch_base
        self.claimed: set[str] = set(skip)  # keys written (or being written) by this call
        self.lock = threading.Lock()
        self.known_bases: set[str] = set(skip)  # bases proven stored (the parent's, or checked)

    def write(self, place: tuple, data: bytes | memoryview) -> tuple[common.ChunkRef, int, bool]:
        """Store the chunk at ``place`` (shard, name, offset): (ref, bytes written,
        stored as a patch). ``data`` is the snapshot's bytes, not a copy: hashed,
        CRC'd and stored from there."""
        ref = common.ChunkRef(hash=hashlib.sha256(data).hexdigest(), size=len(data))
        ref.crc32c = crc32c(data)
        with self.lock:  # identical chunks (zeroed state) are written once
            if ref.hash in self.claimed:
                return ref, 0, False
        if self.store.has_chunk(ref.hash):
            return ref, 0, False
        patched = self._try_patch(place, ref, data)
        if patched is not None:
            return ref, patched, True
        if not self._claim(ref.hash):
            return ref, 0, False
        self._put(ref.hash, data)
        if self.patch_base is not None:
            # stored whole: the new base here (a copy: the snapshot is reused)
            self.patch_base.chunks[place] = (ref.hash, bytes(data))
        return ref, len(data), False

    def _try_patch(self, place, ref: common.ChunkRef, data: bytes | memoryview) -> int | None:
        """Store ``data`` as a patch against the base at ``place``; bytes written, or None."""
        patch_base = self.patch_base
        base = patch_base.chunks.get(place) if patch_base is not None else None
        if base is None or len(base[1]) != len(data):
            return None
        blocks = chunkpatch.changed_blocks(base[1], data, patch_base.block_bytes)
        size = chunkpatch.patch_size(len(data), patch_base.block_bytes, blocks)
        if size > patch_base.max_fraction * len(data):
            return None
        # the base must still be stored (garbage collection may have taken it):
        # publish would refuse a manifest naming a missing base
        if base[0] not in self.known_bases:
            if not self.store.has_chunk(base[0]):
                del patch_base.chunks[place]
                return None
            self.known_bases.add(base[0])
        patch = chunkpatch.make_patch(data, patch_base.block_bytes, blocks)
        ref.base_hash, ref.patch_hash = base[0], hashlib.sha256(patch).hexdigest()
        ref.patch_size, ref.patch_crc32c = len(patch), crc32c(patch)
        if not self._claim(ref.patch_hash) or self.store.has_chunk(ref.patch_hash):
            return 0
        self._put(ref.patch_hash, patch)
        return len(patch)

    def _claim(self, key: str) -> bool:
        """True for the one caller that is to write ``key`` in this call."""
        with self.lock:
            if key in self.claimed:
                return False
            self.claimed.add(key)
            return True

    def _put(self, key: str, data: bytes | memoryview) -> None:
        if self.before_put is not None:
            self.before_put(key)
        # ``key`` was computed from these very bytes a moment ago (its content
        # address): the store need not hash them a second time
        self.store.put_chunk(key, data, verified=True)


def _bounded_map(fn, items: Sequence, workers: int) -> Iterator:
    """``map(fn, items)`` in order on ``workers`` threads, at most 2x``workers`` in flight."""
    if workers <= 1 or len(items) <= 1:
        yield from map(fn, items)
        return
    pool = ThreadPoolExecutor(workers, thread_name_prefix="checkpoint")
    try:
        pending: deque = deque()
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def chunk_hashes(tensors: Iterable[common.CheckpointTensor]) -> set[str]:
    """Every store entry the tensors need (a patched chunk needs its base and patch)."""
    return {key for t in tensors for ref in t.chunks for key in stored_keys(ref)}


# --- manifests ----------------------------------------------------------------------


def checkpoint_id_for(step: int) -> str:
    """A checkpoint id that sorts by step as text too (store listings are sorted)."""
    return f"step-{step:012d}"


def build_manifest(
    *,
    job_id: str,
    checkpoint_id: str,
    step: int,
    tensors: Sequence[common.CheckpointTensor],
    shards: Sequence[common.ShardState] = (),
    parent_id: str = "",
    store_url: str = "",
    written_bytes: int | None = None,
    optimizer: common.OptimizerSpec | None = None,
    consistency: common.ConsistencySpec | None = None,
    num_slots: int = 0,
    data_position: common.DataPosition | None = None,
    gradient_dtype: int = common.DTYPE_UNSPECIFIED,
) -> common.CheckpointManifest:
    """A manifest over the given tensors (from one or many shards)."""
    total = sum(ref.size for t in tensors for ref in t.chunks)
    manifest = common.CheckpointManifest(
        checkpoint_id=checkpoint_id,
        job_id=job_id,
        step=step,
        tensors=tensors,
        parent_id=parent_id,
        total_bytes=total,
        written_bytes=total if written_bytes is None else written_bytes,
        store_url=store_url,
        num_slots=num_slots,
        gradient_dtype=gradient_dtype,
        shards=sorted(shards, key=lambda s: s.shard),
        data_position=data_position or common.DataPosition(step=step),
    )
    if optimizer is not None:
        manifest.optimizer.CopyFrom(optimizer)
    if consistency is not None:
        manifest.consistency.CopyFrom(consistency)
    now = timestamp_pb2.Timestamp()
    now.GetCurrentTime()
    manifest.create_time.CopyFrom(now)
    return manifest


# Publishing a manifest and deleting chunks run one at a time in a process. A chunk
# is content-addressed, so one job's upload reuses a chunk another job's checkpoint
# stored, and that job's retention (run under its own job's lock only) could delete
# it between the publish's check that every chunk is there and the manifest going
# visible: a checkpoint published, and not restorable. Reentrant: make_room runs
# retention. A thread holds it, so an awaiting caller's timeout does not free it.
_CHUNKS_IN_USE = threading.RLock()


def _one_at_a_time(fn):
    @functools.wraps(fn)
    def run(*args, **kwargs):
        with _CHUNKS_IN_USE:
            return fn(*args, **kwargs)

    return run


@_one_at_a_time
def publish(store: Store, manifest: common.CheckpointManifest) -> None:
    """Make the checkpoint visible, after checking every chunk it lists is stored.

    The check closes the gap between "chunks written" and "manifest visible":
    a chunk removed meanwhile (garbage collection of a parent's chunks, a
    store losing data) fails the publish instead of publishing a checkpoint
    that cannot be read.
    """
    _check_structure(manifest)
    missing = sorted(h for h in chunk_hashes(manifest.tensors) if not store.has_chunk(h))
    if missing:
        raise StalwartError(
            ErrorKind.DATA_LOSS,
            f"checkpoint {manifest.job_id}/{manifest.checkpoint_id} not published: "
            f"{len(missing)} chunk(s) missing from {store.url}, first {missing[0]}",
            chunk=missing[0],
        )
    store.publish_manifest(
        manifest.job_id, manifest.checkpoint_id, manifest.SerializeToString(deterministic=True)
    )


def load_manifest(store: Store, job_id: str, checkpoint_id: str) -> common.CheckpointManifest:
    """A published manifest; NOT_FOUND if none, DATA_LOSS if it does not parse or fit."""
    manifest = _parsed_manifest(store, job_id, checkpoint_id)
    _check_structure(manifest)
    return manifest


def _parsed_manifest(store: Store, job_id: str, checkpoint_id: str) -> common.CheckpointManifest:
    """A published manifest as stored, its tensors unchecked (it may still name the
    chunks it holds); NOT_FOUND if none, DATA_LOSS if it does not parse."""
    data = store.get_manifest(job_id, checkpoint_id)
    manifest = common.CheckpointManifest()
    try:
        manifest.ParseFromString(data)
    except pb_message.DecodeError as exc:
        raise StalwartError(
            ErrorKind.DATA_LOSS, f"manifest {job_id}/{checkpoint_id} does not parse: {exc}"
        ) from None
    if (manifest.job_id, manifest.checkpoint_id) != (job_id, checkpoint_id):
        raise StalwartError(
            ErrorKind.DATA_LOSS,
            f"manifest stored as {job_id}/{checkpoint_id} names "
            f"{manifest.job_id}/{manifest.checkpoint_id}",
        )
    return manifest


def _check_structure(manifest: common.CheckpointManifest) -> None:
    """Every tensor's chunks add up to its spec's size (the cheap half of verify)."""
    seen = set()
    for t in manifest.tensors:
        key = (t.shard, t.spec.name)
        if key in seen:
            raise StalwartError(
                ErrorKind.DATA_LOSS, f"tensor {t.spec.name} of shard {t.shard} listed twice"
            )
        seen.add(key)
        expected = _spec_nbytes(t)
        got = sum(ref.size for ref in t.chunks)
        if got != expected:
            raise StalwartError(
                ErrorKind.DATA_LOSS,
                f"tensor {t.spec.name} needs {expected} bytes, its chunks hold {got}",
            )


def _spec_nbytes(t: common.CheckpointTensor) -> int:
    """The bytes a listed tensor needs; DATA_LOSS for a spec no tensor can have. An
    unknown dtype (a flipped byte, or a newer build's) used to raise BAD_DTYPE
    (INVALID_ARGUMENT) out of every listing of the job's checkpoints, so none of
    them, good ones included, could be chosen, and saves and retention failed."""
    if any(d < 0 for d in t.spec.shape):
        raise StalwartError(
            ErrorKind.DATA_LOSS, f"tensor {t.spec.name} has shape {list(t.spec.shape)}"
        )
    try:
        return wiredtypes.tensor_nbytes(t.spec)
    except StalwartError as exc:
        raise StalwartError(ErrorKind.DATA_LOSS, f"tensor {t.spec.name}: {exc.message}") from None


def info_of(manifest: common.CheckpointManifest) -> CheckpointInfo:
    return CheckpointInfo(
        manifest.checkpoint_id, manifest.step, manifest.create_time.ToNanoseconds()
    )


# --- reading ------------------------------------------------------------------------


@dataclass
class ReadStats:
    chunks: int = 0
    bytes: int = 0
    seconds: float = 0.0


def fetch_chunk(store: Store, ref: common.ChunkRef, where: str = "") -> bytes:
    """A chunk's bytes after checking size, CRC32C and SHA-256; DATA_LOSS otherwise.

    A patched chunk is rebuilt from its base and patch, each checked against
    its own hash (and the patch against its CRC32C) before use, and the result
    checked like a plain chunk."""
    name = f"chunk {ref.hash}" + (f" ({where})" if where else "")
    if not ref.patch_hash:
        return _fetch_blob(store, ref.hash, ref.size, ref.crc32c, name)
    base = _fetch_blob(store, ref.base_hash, ref.size, None, f"base {ref.base_hash} of {name}")
    patch = _fetch_blob(
        store, ref.patch_hash, ref.patch_size, ref.patch_crc32c, f"patch {ref.patch_hash} of {name}"
    )
    data = chunkpatch.apply_patch(base, patch)
    _check_blob(store, data, ref.hash, ref.size, ref.crc32c, f"{name} rebuilt from its patch")
    return data


def _fetch_blob(store: Store, key: str, size: int, crc: int | None, name: str) -> bytes:
    try:
        data = store.get_chunk(key, verify=False)  # verified below, with the CRC too
    except StalwartError as exc:
        if exc.kind is ErrorKind.NOT_FOUND:
            raise StalwartError(
                ErrorKind.DATA_LOSS, f"{name} is missing from {store.url}", chunk=key
            ) from None
        raise
    _check_blob(store, data, key, size, crc, name)
    return data


def _check_blob(store: Store, data: bytes, key: str, size: int, crc: int | None, name: str) -> None:
    if len(data) != size:
        raise StalwartError(
            ErrorKind.DATA_LOSS,
            f"{name} holds {len(data)} bytes, the manifest says {size}",
            chunk=key,
        )
    if crc is not None and crc32c(data) != crc:
        raise StalwartError(
            ErrorKind.CHECKSUM_MISMATCH, f"{name} failed its CRC32C in {store.url}", chunk=key
        )
    if hashlib.sha256(data).hexdigest() != key:
        raise StalwartError(
            ErrorKind.CHECKSUM_MISMATCH,
            f"{name} does not match its SHA-256 in {store.url}",
            chunk=key,
        )


def read_tensors(
    store: Store,
    tensors: Sequence[common.CheckpointTensor],
    *,
    workers: int = DEFAULT_WORKERS,
) -> tuple[dict[str, torch.Tensor], ReadStats]:
    """Rebuild the tensors, every chunk verified; DATA_LOSS on the first bad one.

    Nothing is returned unless every chunk checked out, so a caller that
    installs the result only after this returns changes nothing on failure.
    """
    import torch

    from stalwart import codec

    started = time.perf_counter()
    for t in tensors:
        _check_tensor(t)
    out = {
        t.spec.name: torch.empty(tuple(t.spec.shape), dtype=codec.DTYPES[t.spec.dtype])
        for t in tensors
    }
    views = {name: t.reshape(-1).view(torch.uint8).numpy() for name, t in out.items()}
    jobs = []
    for t in tensors:
        offset = 0
        for i, ref in enumerate(t.chunks):
            jobs.append((t.spec.name, offset, ref, f"#{i} of tensor {t.spec.name}"))
            offset += ref.size

    def place(job) -> None:
        # each worker copies its own verified chunk into place (numpy lets go of
        # the GIL for the copy), so copies overlap other chunks' reads and hashes
        name, offset, ref, where = job
        data = fetch_chunk(store, ref, where)
        views[name][offset : offset + ref.size] = np.frombuffer(data, dtype=np.uint8)

    stats = ReadStats()
    for (_, _, ref, _), _ in zip(jobs, _bounded_map(place, jobs, workers), strict=True):
        stats.chunks += 1
        stats.bytes += ref.size
    stats.seconds = time.perf_counter() - started
    return out, stats


def _check_tensor(t: common.CheckpointTensor) -> None:
    if t.spec.dtype not in wiredtypes.ITEMSIZE:
        raise StalwartError(
            ErrorKind.DATA_LOSS, f"tensor {t.spec.name} has unknown dtype {t.spec.dtype}"
        )
    expected = wiredtypes.tensor_nbytes(t.spec)
    if sum(ref.size for ref in t.chunks) != expected:
        raise StalwartError(
            ErrorKind.DATA_LOSS, f"tensor {t.spec.name}: chunk sizes do not add up to {expected}"
        )


# --- verifying and choosing ---------------------------------------------------------


@dataclass
class VerifyReport:
    checkpoint_id: str
    ok: bool = True
    chunks: int = 0
    bytes: int = 0
    problems: list[str] = field(default_factory=list)


def verify(
    store: Store, manifest: common.CheckpointManifest, *, workers: int = DEFAULT_WORKERS
) -> VerifyReport:
    """Read every distinct chunk the manifest lists and check size, CRC32C and hash."""
    report = VerifyReport(manifest.checkpoint_id)
    try:
        _check_structure(manifest)
    except StalwartError as exc:
        report.ok = False
        report.problems.append(exc.message)
        return report
    refs: dict[tuple[str, str], tuple[common.ChunkRef, str]] = {}
    for t in manifest.tensors:
        for i, ref in enumerate(t.chunks):
            refs.setdefault((ref.hash, ref.patch_hash), (ref, f"#{i} of tensor {t.spec.name}"))

    def check(item: tuple[common.ChunkRef, str]) -> str:
        try:
            fetch_chunk(store, *item)
        except StalwartError as exc:
            if exc.kind.code is not ErrorKind.DATA_LOSS.code:
                raise  # unreachable store: not a verdict on the checkpoint
            return exc.message
        return ""

    for (ref, _), problem in zip(
        refs.values(), _bounded_map(check, list(refs.values()), workers), strict=True
    ):
        report.chunks += 1
        report.bytes += ref.size
        if problem:
            report.ok = False
            report.problems.append(problem)
    return report


@dataclass
class Choice:
    """The newest checkpoint that verified (None if none did) and what was skipped."""

    manifest: common.CheckpointManifest | None
    skipped: list[tuple[str, str]] = field(default_factory=list)


def list_checkpoints(
    store: Store, job_id: str
) -> tuple[list[common.CheckpointManifest], list[tuple[str, str]]]:
    """A job's readable manifests, newest first, and (id, reason) for unreadable ones."""
    manifests, unreadable = [], []
    for checkpoint_id in store.list_manifests(job_id):
        try:
            manifests.append(load_manifest(store, job_id, checkpoint_id))
        except StalwartError as exc:
            if exc.kind is ErrorKind.NOT_FOUND:
                continue  # deleted since the listing
            if exc.kind.code is not ErrorKind.DATA_LOSS.code:
                raise
            unreadable.append((checkpoint_id, exc.message))
    by_id = {m.checkpoint_id: m for m in manifests}
    ordered = [by_id[i.checkpoint_id] for i in newest_first(info_of(m) for m in manifests)]
    return ordered, unreadable


def choose_newest_verified(store: Store, job_id: str, *, workers: int = DEFAULT_WORKERS) -> Choice:
    """The newest checkpoint of ``job_id`` whose every chunk verifies.

    Corrupt ones (unreadable manifest, missing or corrupt chunk) are skipped,
    logged and counted in ``stalwart_checkpoints_corrupt_total``.
    """
    manifests, skipped = list_checkpoints(store, job_id)
    choice = Choice(None, list(skipped))
    for manifest in manifests:
        report = verify(store, manifest, workers=workers)
        if report.ok:
            choice.manifest = manifest
            break
        choice.skipped.append((manifest.checkpoint_id, report.problems[0]))
    for checkpoint_id, reason in choice.skipped:
        CORRUPT_CHECKPOINTS.inc()
        log.warning(
            "corrupt checkpoint skipped", job=job_id, checkpoint=checkpoint_id, reason=reason
        )
    return choice


# --- retention, garbage collection, tiering -----------------------------------------


@dataclass
class RetentionResult:
    kept: list[str]
    deleted_manifests: list[str]
    deleted_chunks: int


@_one_at_a_time
def apply_retention(
    store: Store,
    job_id: str,
    keep: int,
    *,
    live_jobs: Iterable[str] = (),
    pinned: Collection[str] = (),
) -> RetentionResult:
    """Keep the newest ``keep`` checkpoints of ``job_id``; delete the others and
    the chunks only they referenced.

    Chunks are content-addressed, so another job's checkpoints may share them:
    every job with a manifest in the store keeps the chunks it names, and so does
    each of ``live_jobs``.
    Manifests go first, chunks after, so a crash in between leaves only
    unreferenced chunks (swept by :func:`collect_garbage`), never a visible
    checkpoint with missing chunks.
    """
    manifests, _ = list_checkpoints(store, job_id)
    decision = RetentionPolicy(keep).decide((info_of(m) for m in manifests), pinned)
    by_id = {m.checkpoint_id: m for m in manifests}
    candidates: set[str] = set()
    for checkpoint_id in decision.delete:
        candidates |= chunk_hashes(by_id[checkpoint_id].tensors)
        store.delete_manifest(job_id, checkpoint_id)
    references = {c: chunk_hashes(by_id[c].tensors) for c in decision.keep}
    references.update(_references(store, _other_jobs(store, job_id, live_jobs)))
    garbage = unreferenced_chunks(candidates, references)
    deleted = sum(store.delete_chunk(h) for h in garbage)
    log.info(
        "checkpoint retention",
        job=job_id,
        kept=len(decision.keep),
        deleted_manifests=len(decision.delete),
        deleted_chunks=deleted,
    )
    return RetentionResult(list(decision.keep), list(decision.delete), deleted)


# --- capacity -----------------------------------------------------------------------


def require_room(store: Store, job_id: str, needed_bytes: int) -> None:
    """Refuse, before a byte is written, a checkpoint that may not fit the store.

    ``needed_bytes`` is what the write may cost at most (the state's size; a
    delta costs less). RESOURCE_EXHAUSTED names the figures; nothing is written,
    so the newest complete checkpoint stays valid and training goes on."""
    cap = store.capacity()
    if cap is None or needed_bytes <= cap.free_bytes:
        return
    raise StalwartError(
        ErrorKind.STORE_FULL,
        f"checkpoint of {job_id} needs up to {needed_bytes} bytes but store {store.url} has "
        f"{cap.free_bytes} of its {cap.limit_bytes} free; not written (the last complete "
        f"checkpoint stays valid). Raise the store's budget or delete checkpoints.",
        store=store.url,
    )


def make_room(
    store: Store, job_id: str, needed_bytes: int, *, live_jobs: Iterable[str] = ()
) -> None:
    """Before a checkpoint of ``job_id``: when it may not fit, apply retention down
    to the newest checkpoint of the job (which stays), then require the room."""
    cap = store.capacity()
    if cap is None or needed_bytes <= cap.free_bytes:
        return
    apply_retention(store, job_id, 1, live_jobs=live_jobs)
    require_room(store, job_id, needed_bytes)


@_one_at_a_time
def delete_checkpoint(
    store: Store, job_id: str, checkpoint_id: str, *, live_jobs: Iterable[str] = ()
) -> int:
    """Unpublish one checkpoint, then delete the chunks (and patch bases) that no
    other manifest of ``job_id`` or ``live_jobs`` names; returns how many.

    Every manifest lists all its chunks, so no other checkpoint depends on this
    one: deleting a delta's parent leaves the delta readable."""
    manifest = load_manifest(store, job_id, checkpoint_id)  # NOT_FOUND if absent
    store.delete_manifest(job_id, checkpoint_id)
    references = _references(store, [job_id, *_other_jobs(store, job_id, live_jobs)])
    garbage = unreferenced_chunks(chunk_hashes(manifest.tensors), references)
    return sum(store.delete_chunk(h) for h in garbage)


@_one_at_a_time
def collect_garbage(store: Store, jobs: Iterable[str], protect: Collection[str] = ()) -> int:
    """Delete every stored chunk no manifest of ``jobs`` lists (e.g. the chunks of
    an upload that died before publishing). ``jobs`` must name every job with
    checkpoints in this store, and ``protect`` the chunks of uploads in
    progress; returns the number of chunks deleted."""
    jobs = sorted({*jobs, *store.list_manifest_jobs()})
    garbage = unreferenced_chunks(store.list_chunks(), _references(store, jobs), protect)
    return sum(store.delete_chunk(h) for h in garbage)


def _other_jobs(store: Store, job_id: str, live_jobs: Iterable[str]) -> list[str]:
    """Every job but ``job_id`` whose checkpoints may name a chunk: ``live_jobs`` and
    each job with a manifest in the store. The caller's list alone missed jobs it
    did not know (``ckpt rm --store-url`` passed none; another cluster sharing the
    store), and their checkpoints lost the chunks they shared."""
    return sorted({*live_jobs, *store.list_manifest_jobs()} - {job_id})


def _references(store: Store, jobs: Iterable[str]) -> dict[str, set[str]]:
    refs: dict[str, set[str]] = {}
    for job in jobs:
        manifests, unreadable = list_checkpoints(store, job)
        for checkpoint_id, _ in unreadable:
            try:  # one that parses still names its chunks (a tensor spec gone bad)
                manifests.append(_parsed_manifest(store, job, checkpoint_id))
            except StalwartError:
                # we cannot know which chunks it needs, so we cannot prove any
                # chunk unreferenced: refuse rather than guess
                raise StalwartError(
                    ErrorKind.DATA_LOSS,
                    f"manifest {job}/{checkpoint_id} is unreadable; garbage collection refused",
                ) from None
        for m in manifests:
            refs[f"{job}/{m.checkpoint_id}"] = chunk_hashes(m.tensors)
    return refs


def copy_checkpoint(
    source: Store,
    target: Store,
    manifest: common.CheckpointManifest,
    *,
    workers: int = DEFAULT_WORKERS,
) -> WriteStats:
    """Copy a checkpoint to another store (the durable tier): the chunks the
    target lacks, each verified on the way, then the manifest, last."""
    started = time.perf_counter()
    stats = WriteStats()
    refs: dict[tuple[str, str], common.ChunkRef] = {}
    for t in manifest.tensors:
        for ref in t.chunks:
            refs.setdefault((ref.hash, ref.patch_hash), ref)
            stats.total_chunks += 1
            stats.total_bytes += ref.size

    def copy(ref: common.ChunkRef) -> int:
        missing = [k for k in stored_keys(ref) if not target.has_chunk(k)]
        if not missing:
            return 0
        data = fetch_chunk(source, ref)  # a patch: base, patch and their result verified
        # every put below stores bytes just checked against their hash on the way
        # in: the target need not hash them again
        if not ref.patch_hash:
            target.put_chunk(ref.hash, data, verified=True)
            return ref.size
        written = 0
        for key in missing:
            blob = source.get_chunk(key, verify=True)
            target.put_chunk(key, blob, verified=True)
            written += len(blob)
        return written

    for written in _bounded_map(copy, list(refs.values()), workers):
        if written:
            stats.written_chunks += 1
            stats.written_bytes += written
    copied = common.CheckpointManifest()
    copied.CopyFrom(manifest)
    copied.store_url = target.url
    publish(target, copied)
    stats.seconds = time.perf_counter() - started
    return stats


# --- stores, opened once ------------------------------------------------------------


class StorePool:
    """Stores opened once per URL and shared (stores are thread-safe)."""

    def __init__(self, opener: Callable[[str], Store] = open_store):
        self._opener = opener
        self._stores: dict[str, Store] = {}
        self._lock = threading.Lock()

    def get(self, url: str) -> Store:
        with self._lock:
            store = self._stores.get(url)
            if store is None:
                # opened under the lock: two first callers must not both connect
                store = self._stores[url] = self._opener(url)
            return store

    def close(self) -> None:
        with self._lock:
            stores, self._stores = list(self._stores.values()), {}
        for store in stores:
            store.close()


def state_items(
    tensors: Mapping[str, torch.Tensor],
    params: Collection[str],
    shard: int = 0,
    buffers: Collection[str] = (),
) -> list[TensorItem]:
    """Items for a model's state named as ``JobModel.state_tensors()`` names it:
    parameters as "param", module buffers as "buffer", optimizer state
    ``<param>/<key>`` as kind ``<key>``."""

    def kind(name: str) -> str:
        if name in buffers:
            return KIND_BUFFER
        return KIND_PARAM if name in params else name.rpartition("/")[2]

    return [TensorItem(name, t, kind(name), shard) for name, t in tensors.items()]
