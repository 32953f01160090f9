"""``stalwart bench exchange``: one sync step's push + pull of a model with 3 trainers,
against a gloo all_reduce of the same bytes over 3 processes, in the same run.

Stalwart side: per shard group a paramserver primary replicating to one backup
(local processes); three slot clients, in this process, push their gradients
for the same step at once (the step commits when the third lands) and then
pull the new version at once. One measurement is the wall time from the
pushes' start to the last pull's end, after one warm-up step. Run with one
shard group and with ``shard_groups`` of them (the model split by the
deterministic shard map, groups pushed and pulled in parallel).

Baseline: ``torchrun --nproc-per-node 3`` over
:mod:`stalwart.bench.allreduce_worker`, all_reduce of one float32 tensor of the
same size. Figures are medians over ``repeats``.

With ``bf16_gradients`` the slot clients push their gradients as bfloat16
(``JobSpec.gradient_dtype``: half the bytes; the pull stays float32), against the
same float32 all_reduce, which is what DDP runs without a compression hook.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from stalwart import gradients
from stalwart.api import common
from stalwart.bench.ps import make_model
from stalwart.client import ParamServerClient, ShardGroupClient
from stalwart.procs import ServiceStarter, owned_services

GOAL = 1.5
SLOTS = 3


def _start_groups(count: int, start: ServiceStarter) -> list[list[str]]:
    """Start ``count`` groups (primary + backup) and return their addresses."""
    groups = []
    for g in range(count):
        backup = start("services.paramserver", ["--role", "backup"], f"ps-{g}b")
        primary = start("services.paramserver",
                        ["--role", "primary", "--backups", backup.address], f"ps-{g}a")  # fmt: skip
        groups.append([primary.address, backup.address])
    return groups


def _client(groups: list[list[str]]) -> ParamServerClient:
    return ParamServerClient([ShardGroupClient(a) for a in groups])


async def _steps(groups: list[list[str]], model, repeats: int, wire: int) -> list[float]:
    clients = [_client(groups) for _ in range(SLOTS)]
    sgd = common.OptimizerSpec(kind=common.OPTIMIZER_KIND_SGD, lr=0.01, momentum=0.9)
    sync = common.ConsistencySpec(mode=common.CONSISTENCY_MODE_SYNC)
    for c in clients:
        await c.register_model("exchange", model, sgd, sync, SLOTS, gradient_dtype=wire)
    grads = gradients.narrowed({n: torch.full_like(t, 1e-3) for n, t in model.items()}, wire)
    times = []
    try:
        for step in range(repeats + 1):
            started = time.perf_counter()
            await asyncio.gather(*(c.push("exchange", step, k, step, grads)
                                   for k, c in enumerate(clients)))  # fmt: skip
            await asyncio.gather(*(c.pull("exchange", step, step + 1) for c in clients))
            if step:  # the first step warms connections and allocators
                times.append(time.perf_counter() - started)
    finally:
        await asyncio.gather(*(c.close() for c in clients))
    return times


def _through_stalwart(
    shard_groups: int, model, repeats: int, run_dir: Path, wire: int
) -> list[float]:
    with owned_services(run_dir) as start:  # they stop even if this command is killed
        groups = _start_groups(shard_groups, start)
        return asyncio.run(_steps(groups, model, repeats, wire))


def _allreduce(mib: int, repeats: int, run_dir: Path) -> list[float]:
    out = run_dir / "allreduce.txt"
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={SLOTS}", "-m", "stalwart.bench.allreduce_worker",
            "--mib", str(mib), "--repeats", str(repeats), "--out", str(out)]  # fmt: skip
    with open(run_dir / "allreduce.log", "wb") as log:
        subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, check=True, timeout=600,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))  # fmt: skip
    return [float(x) for x in out.read_text().split()]


def _ms(times: list[float]) -> float:
    return round(1000 * statistics.median(times), 1)


def run(
    model_mib: int = 64, repeats: int = 5, shard_groups: int = 3, bf16_gradients: bool = False
) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix="stalwart-bench-exchange-"))
    model = make_model(model_mib)
    wire = common.DTYPE_BFLOAT16 if bf16_gradients else common.DTYPE_UNSPECIFIED
    reduce_ms = _ms(_allreduce(model_mib, repeats, run_dir))
    one = _ms(_through_stalwart(1, model, repeats, run_dir, wire))
    many = _ms(_through_stalwart(shard_groups, model, repeats, run_dir, wire))
    return {
        "model_bytes": sum(t.numel() * t.element_size() for t in model.values()),
        "trainers": SLOTS,
        "gradient_dtype": "bfloat16" if bf16_gradients else "float32",
        "repeats": repeats,
        "gloo_allreduce_ms": reduce_ms,
        "push_pull_ms_1_group": one,
        "vs_allreduce_1_group": round(one / reduce_ms, 3),
        f"push_pull_ms_{shard_groups}_groups": many,
        f"vs_allreduce_{shard_groups}_groups": round(many / reduce_ms, 3),
        "goal": f"<= {GOAL} x the all_reduce",
        "replication": "primary + 1 backup per group",
        "trainer_clients": "3 slot clients in one process",
        "load_average_1m": round(os.getloadavg()[0], 2),
        "run_dir": str(run_dir),
    }
