"""``stalwart bench ckpt``: checkpoint save/restore, training stall and delta size.

Everything is measured in the same run, per backend URL given:

- **save / restore MB/s** of a ``model_mib`` float32 model through
  :mod:`stalwart.checkpoint` (chunk, hash, CRC32C, store, publish; read,
  verify, reassemble), against the store's raw ``put_chunk`` / ``get_chunk``
  of the very same chunk bytes, one after another (the store's own SHA-256
  check included: the one hash a put of bytes it did not hash pays, where the
  checkpoint writer's hash for the address stands in for it), and against
  ``torch.save`` / ``torch.load`` of the same tensors to /dev/shm;
- **training stall**: a real sync loop (one slot) against a paramserver primary
  + backup started here, a SaveCheckpoint after every step; the stall is the
  paramserver's ``snapshot_seconds`` (the only time the job's lock is held for
  the checkpoint) over the step time. The step-time slowdown against steps
  without checkpoints is reported too: on a machine with few cores the
  background upload competes with training for CPU;
- **delta size**: an embedding table with 1% of its rows (uniformly random)
  changed per interval; full checkpoint bytes over delta bytes, per chunk size
  (whole-chunk deltas) and with row-level patches (``patch_chunk_*``).
  Backend-independent (it counts bytes), so measured once, on the first URL.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import grpc
import torch

from stalwart import checkpoint as ckpt
from stalwart.api import common, paramserver, paramserver_grpc
from stalwart.channel import open_channel
from stalwart.client import ParamServerClient, ShardGroupClient
from stalwart.procs import owned_services
from stalwart.stores import Store, chunk_hash, open_store

MIB = 1024 * 1024
GOALS = {
    "save_vs_raw_put": ">= 0.8",
    "restore_vs_raw_get": ">= 0.8",
    "stall_fraction": "<= 0.03",
    "delta_size_ratio": ">= 17",
}


def _model(total_mib: int, tensor_mib: int = 16) -> dict[str, torch.Tensor]:
    # fresh random bytes every run, so nothing already stored dedupes them away
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    count = max(1, total_mib // tensor_mib)
    rows = min(total_mib, tensor_mib) * MIB // 4 // 1024
    return {f"layer{i}.weight": torch.randn(rows, 1024, generator=gen) for i in range(count)}


def _mb_s(nbytes: int, seconds: float) -> float:
    return round(nbytes / 1e6 / seconds, 1) if seconds > 0 else float("inf")


# --- save / restore vs raw ------------------------------------------------------------


def save_restore(store: Store, model_mib: int, chunk_bytes: int) -> dict:
    """Checkpoint save/restore against raw put/get of the same chunk bytes."""
    model = _model(model_mib)
    items = ckpt.state_items(model, model)
    job = f"bench-{os.urandom(4).hex()}"
    started = time.perf_counter()
    refs, stats = ckpt.write_tensors(store, items, chunk_bytes=chunk_bytes)
    manifest = ckpt.build_manifest(
        job_id=job, checkpoint_id="full", step=0, tensors=refs, store_url=store.url
    )
    ckpt.publish(store, manifest)
    save_s = time.perf_counter() - started
    assert stats.written_chunks == stats.total_chunks, "fresh bytes must all be written"

    started = time.perf_counter()
    back, _ = ckpt.read_tensors(store, ckpt.load_manifest(store, job, "full").tensors)
    restore_s = time.perf_counter() - started
    assert all(torch.equal(back[n], t) for n, t in model.items()), "restore is not bitwise"
    del back

    # the same bytes, straight through the store
    chunks = [bytes(store.get_chunk(r.hash)) for t in refs for r in t.chunks]
    hashes = [chunk_hash(c) for c in chunks]
    for h in hashes:
        store.delete_chunk(h)
    started = time.perf_counter()
    for h, c in zip(hashes, chunks, strict=True):
        store.put_chunk(h, c)
    put_s = time.perf_counter() - started
    started = time.perf_counter()
    for h in hashes:
        store.get_chunk(h)
    get_s = time.perf_counter() - started

    store.delete_manifest(job, "full")
    for h in hashes:
        store.delete_chunk(h)
    nbytes = stats.total_bytes
    return {
        "bytes": nbytes,
        "chunks": stats.total_chunks,
        "save_mb_s": _mb_s(nbytes, save_s),
        "restore_mb_s": _mb_s(nbytes, restore_s),
        "raw_put_mb_s": _mb_s(nbytes, put_s),
        "raw_get_mb_s": _mb_s(nbytes, get_s),
        "save_vs_raw_put": round(put_s / save_s, 3),
        "restore_vs_raw_get": round(get_s / restore_s, 3),
    }


def torch_baseline(model_mib: int) -> dict:
    """torch.save / torch.load of the same amount of tensors to /dev/shm."""
    model = _model(model_mib)
    nbytes = sum(t.numel() * t.element_size() for t in model.values())
    parent = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    fd, path = tempfile.mkstemp(prefix="stalwart-bench-", suffix=".pt", dir=parent)
    os.close(fd)
    try:
        started = time.perf_counter()
        torch.save(model, path)
        save_s = time.perf_counter() - started
        started = time.perf_counter()
        torch.load(path, weights_only=True)
        load_s = time.perf_counter() - started
    finally:
        os.unlink(path)
    return {"torch_save_mb_s": _mb_s(nbytes, save_s), "torch_load_mb_s": _mb_s(nbytes, load_s)}


# --- training stall ---------------------------------------------------------------------


async def stall(
    addresses: Sequence[str], store: Store, model_mib: int, steps: int, chunk_bytes: int
) -> dict:
    """Sync steps without checkpoints, then with one at every version.

    Each save is sent two steps before the commit it is aimed at, as the leader aims
    its checkpoints at a version the job has not reached: the paramserver snapshots at
    that commit (the stall, inside the step) and uploads while the next step runs; the
    trainer waits for that upload before the step after it (one upload at a time). A
    save asked for the version the job held raced the next step's commit, and with a
    small model lost it. A save that still finds the job past its version is counted
    missed. One untimed save first: the paramserver opens the store on the first.
    """
    job = f"stall-{os.urandom(4).hex()}"
    model = _model(model_mib)
    group = ShardGroupClient(list(addresses), call_timeout_s=120)
    client = ParamServerClient([group])
    sgd = common.OptimizerSpec(kind=common.OPTIMIZER_KIND_SGD, lr=1e-3)
    sync = common.ConsistencySpec(mode=common.CONSISTENCY_MODE_SYNC)
    await client.register_model(job, model, sgd, sync, num_slots=1)
    grads = {n: torch.full_like(t, 1e-3) for n, t in model.items()}
    stub = paramserver_grpc.ParamServerServiceStub(open_channel(addresses[0]))
    version = 0

    async def step() -> float:
        nonlocal version
        started = time.perf_counter()
        await client.pull(job, since_version=-1)
        await client.push(job, version, 0, version, grads)
        version += 1
        return time.perf_counter() - started

    async def saved(at: int) -> paramserver.SaveCheckpointResponse | None:
        request = paramserver.SaveCheckpointRequest(
            job_id=job, checkpoint_id=ckpt.checkpoint_id_for(at), store_url=store.url,
            at_version=at, epoch=group.epoch, chunk_size=chunk_bytes,
        )  # fmt: skip
        try:
            part = await stub.SaveCheckpoint(request, timeout=300)
        except grpc.aio.AioRpcError as err:
            if err.code() != grpc.StatusCode.FAILED_PRECONDITION:  # past `at`: missed
                raise
            return None
        # nothing publishes these: drop their chunks so the store does not fill up
        await asyncio.to_thread(
            lambda: [store.delete_chunk(h) for h in ckpt.chunk_hashes(part.tensors)]
        )
        return part

    saves: dict[int, asyncio.Future] = {}
    try:
        await step()  # warm-up
        plain = [await step() for _ in range(steps)]
        warm = asyncio.ensure_future(saved(version + 1))
        await step()
        await warm
        with_ckpt, parts = [], []
        for ahead in (1, 2):
            saves[version + ahead] = asyncio.ensure_future(saved(version + ahead))
        for _ in range(steps):
            seconds = await step()  # its commit is the version a save waits for
            uploading = saves.pop(version - 1, None)  # uploaded while this step ran
            if uploading is not None:
                waited = time.perf_counter()
                parts.append(await uploading)
                seconds += time.perf_counter() - waited
            with_ckpt.append(seconds)
            saves[version + 2] = asyncio.ensure_future(saved(version + 2))
        parts.append(await saves.pop(version))
    finally:
        for waiting in saves.values():  # aimed at versions no step will make
            waiting.cancel()
        await asyncio.gather(*saves.values(), return_exceptions=True)
        await client.close()
    return _stall_figures(model, steps, plain, with_ckpt, [p for p in parts if p is not None])


def _stall_figures(model, steps: int, plain: list[float], with_ckpt: list[float],
                   parts: list[paramserver.SaveCheckpointResponse]) -> dict:  # fmt: skip
    step_s = statistics.mean(with_ckpt)
    snapshot = statistics.mean(p.snapshot_seconds for p in parts) if parts else None
    upload = statistics.mean(p.upload_seconds for p in parts) if parts else None
    return {
        "model_bytes": sum(t.numel() * t.element_size() for t in model.values()),
        "steps": steps,
        "checkpoints_missed": steps - len(parts),
        "step_seconds_without_checkpoints": round(statistics.mean(plain), 4),
        "step_seconds_with_checkpoints": round(step_s, 4),
        "snapshot_seconds": None if snapshot is None else round(snapshot, 4),
        "upload_seconds": None if upload is None else round(upload, 4),
        "stall_fraction": None if snapshot is None else round(snapshot / step_s, 4),
        "step_slowdown": round(step_s / statistics.mean(plain) - 1, 4),
    }


# --- delta size ---------------------------------------------------------------------------


def delta_size(
    store: Store, table_mib: int, chunk_sizes: Sequence[int], touched: float, intervals: int
) -> dict:
    """Full over delta bytes for an embedding table with ``touched`` of its rows changed."""
    dim = 64
    rows = table_mib * MIB // (4 * dim)
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    out = {"table_bytes": rows * dim * 4, "rows": rows, "touched_fraction": touched}
    # whole-chunk deltas per chunk size, then row-level ones (patches of one
    # row per block) with the default chunk size
    variants = [(f"chunk_{c}", c, None) for c in chunk_sizes]
    variants.append((f"patch_chunk_{ckpt.DEFAULT_CHUNK_BYTES}_block_{dim * 4}",
                     ckpt.DEFAULT_CHUNK_BYTES, dim * 4))  # fmt: skip
    for label, chunk, block in variants:
        base = ckpt.PatchBase(block_bytes=block) if block else None
        table = torch.randn(rows, dim, generator=gen)
        items = [ckpt.TensorItem("table.weight", table)]
        refs, full = ckpt.write_tensors(store, items, chunk_bytes=chunk, patch_base=base)
        seen = ckpt.chunk_hashes(refs)
        written = []
        for _ in range(intervals):
            picked = torch.randperm(rows, generator=gen)[: max(1, int(rows * touched))]
            table[picked] += 1e-3
            refs, stats = ckpt.write_tensors(
                store, items, chunk_bytes=chunk, skip=ckpt.chunk_hashes(refs), patch_base=base
            )
            written.append(stats.written_bytes)
            seen |= ckpt.chunk_hashes(refs)
        out[label] = {
            "full_bytes": full.total_bytes,
            "delta_bytes": int(statistics.mean(written)),
            "delta_size_ratio": round(full.total_bytes / max(1, statistics.mean(written)), 2),
        }
        if block:
            # patches are cumulative against their base: the n-th interval's
            # patch holds every row changed since the base was written
            out[label]["delta_bytes_per_interval"] = written
        # the chunks are nobody's checkpoint: remove them (random data: this table's only)
        for h in seen:
            store.delete_chunk(h)
    return out


# --- the whole run ----------------------------------------------------------------------


async def run(
    urls: Mapping[str, str],
    model_mib: int = 256,
    stall_model_mib: int | None = None,
    stall_steps: int = 3,
    chunk_bytes: int = ckpt.DEFAULT_CHUNK_BYTES,
    delta_chunk_sizes: Sequence[int] = (ckpt.DEFAULT_CHUNK_BYTES, 64 * 1024, 4 * 1024),
    delta_table_mib: int = 16,
    run_dir: Path | None = None,
) -> dict:
    """Every figure for every backend in ``urls`` (name -> store URL)."""
    run_dir = run_dir or Path(tempfile.mkdtemp(prefix="stalwart-bench-ckpt-"))
    result: dict = {
        "model_mib": model_mib,
        "chunk_bytes": chunk_bytes,
        "goals": GOALS,
        "baseline": torch_baseline(model_mib),
        "backends": {},
    }
    ps = "services.paramserver"
    with owned_services(run_dir, timeout=120) as start:  # they stop even if this is killed
        backup = start(ps, ["--role", "backup"], "ps-backup")
        primary = start(ps, ["--role", "primary", "--backups", backup.address], "ps-primary")
        for name, url in urls.items():
            store = await asyncio.to_thread(open_store, url)
            try:
                figures = await asyncio.to_thread(save_restore, store, model_mib, chunk_bytes)
                base = result["baseline"]
                figures["save_vs_torch_save"] = round(
                    figures["save_mb_s"] / base["torch_save_mb_s"], 3
                )
                figures["restore_vs_torch_load"] = round(
                    figures["restore_mb_s"] / base["torch_load_mb_s"], 3
                )
                figures["stall"] = await stall(
                    [primary.address, backup.address],
                    store,
                    stall_model_mib or model_mib,
                    stall_steps,
                    chunk_bytes,
                )
                if "delta" not in result:
                    result["delta"] = await asyncio.to_thread(
                        delta_size, store, delta_table_mib, delta_chunk_sizes, 0.01, 3
                    )
                    result["delta"]["store"] = name
            finally:
                await asyncio.to_thread(store.close)
            result["backends"][name] = figures
    result["run_dir"] = str(run_dir)
    return result


def main(urls: Mapping[str, str], model_mib: int = 256, **kwargs) -> dict:
    """Blocking entry point for the CLI: ``{"shm": "shm:///dev/shm/x", "redis": ...}``."""
    return asyncio.run(run(urls, model_mib, **kwargs))
