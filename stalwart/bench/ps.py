"""``stalwart bench ps``: parameter-server throughput against raw gRPC.

Starts, as local processes on loopback: a paramserver primary with one backup,
a lone primary without backups, and a bare gRPC echo server. With one client
(one trainer slot, sync mode, SGD) it measures, on the same payload:

- push MB/s and pull MB/s through the replicated paramserver;
- raw gRPC unary MB/s, uploading and downloading the same bytes in messages of
  the same chunk size, one call after another;
- push MB/s through the lone primary, for the replication overhead
  (push time with a backup / push time without).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import torch

from stalwart import codec
from stalwart.api import common
from stalwart.bench import echo
from stalwart.client import ParamServerClient, ShardGroupClient
from stalwart.procs import owned_services

MIB = 1024 * 1024


def make_model(total_mib: int, tensor_mib: int = 4) -> dict[str, torch.Tensor]:
    """``total_mib`` of float32 parameters in tensors of ``tensor_mib`` each."""
    gen = torch.Generator().manual_seed(0)
    count = max(1, total_mib // tensor_mib)
    rows = tensor_mib * MIB // 4 // 1024
    return {f"layer{i}.weight": torch.randn(rows, 1024, generator=gen) for i in range(count)}


async def _timed(fn: Callable[[], Awaitable[object]], repeats: int) -> float:
    await fn()  # warm-up: connections, caches, allocator
    start = time.perf_counter()
    for _ in range(repeats):
        await fn()
    return (time.perf_counter() - start) / repeats


async def _raw_grpc(address: str, nbytes: int, chunk: int, repeats: int) -> tuple[float, float]:
    """Seconds per payload for raw unary upload and download in chunk-sized calls."""
    channel = grpc.aio.insecure_channel(
        address,
        options=[
            ("grpc.max_send_message_length", 2 * chunk),
            ("grpc.max_receive_message_length", 2 * chunk),
        ],
    )
    upload = channel.unary_unary(echo.UPLOAD)
    download = channel.unary_unary(echo.DOWNLOAD)
    payload = bytes(chunk)
    calls = max(1, nbytes // chunk)

    async def up():
        for _ in range(calls):
            await upload(payload, timeout=30)

    async def down():
        for _ in range(calls):
            await download(str(chunk).encode(), timeout=30)

    try:
        return await _timed(up, repeats), await _timed(down, repeats)
    finally:
        await channel.close()


async def _through_ps(addresses: list[str], model, repeats: int) -> tuple[float, float]:
    group = ShardGroupClient(addresses)
    client = ParamServerClient([group])
    optimizer = common.OptimizerSpec(kind=common.OPTIMIZER_KIND_SGD, lr=0.01, momentum=0.9)
    consistency = common.ConsistencySpec(mode=common.CONSISTENCY_MODE_SYNC)
    await client.register_model("bench", model, optimizer, consistency, num_slots=1)
    grads = {n: torch.full_like(t, 1e-3) for n, t in model.items()}
    step = 0

    async def push():
        nonlocal step
        await client.push("bench", step, 0, step, grads)
        step += 1

    async def pull():
        await client.pull("bench", since_version=-1)

    try:
        return await _timed(push, repeats), await _timed(pull, repeats)
    finally:
        await client.close()


async def run(model_mib: int = 64, repeats: int = 5, run_dir: Path | None = None) -> dict:
    run_dir = run_dir or Path(tempfile.mkdtemp(prefix="stalwart-bench-ps-"))
    chunk = codec.DEFAULT_CHUNK_BYTES
    model = make_model(model_mib)
    nbytes = sum(t.numel() * t.element_size() for t in model.values())
    ps = "services.paramserver"
    with owned_services(run_dir) as start:  # they stop even if this command is killed
        backup = start(ps, ["--role", "backup"], "ps-backup")
        primary = start(ps, ["--role", "primary", "--backups", backup.address], "ps-primary")
        lone = start(ps, ["--role", "primary"], "ps-lone")
        bare = start("stalwart.bench.echo", [], "echo")
        raw_up, raw_down = await _raw_grpc(bare.address, nbytes, chunk, repeats)
        push, pull = await _through_ps([primary.address, backup.address], model, repeats)
        lone_push, _ = await _through_ps([lone.address], model, repeats)
    mb = nbytes / 1e6
    return {
        "model_bytes": nbytes,
        "chunk_bytes": chunk,
        "repeats": repeats,
        "push_mb_s": round(mb / push, 1),
        "pull_mb_s": round(mb / pull, 1),
        "raw_grpc_upload_mb_s": round(mb / raw_up, 1),
        "raw_grpc_download_mb_s": round(mb / raw_down, 1),
        "push_vs_raw": round(raw_up / push, 3),
        "pull_vs_raw": round(raw_down / pull, 3),
        "push_without_backup_mb_s": round(mb / lone_push, 1),
        "replication_overhead": round(push / lone_push, 3),
        "goals": {
            "push_vs_raw": ">= 0.8",
            "pull_vs_raw": ">= 0.8",
            "replication_overhead": "<= 1.3",
        },
        "run_dir": str(run_dir),
    }


def main(model_mib: int = 64, repeats: int = 5) -> dict:
    return asyncio.run(run(model_mib, repeats))
