"""The torchrun + DDP (gloo) side of ``stalwart bench ddp``: run, optionally kill a rank, read.

Each run gets a fresh folder in /dev/shm (the checkpoints go there too) and
starts ``torchrun --standalone --nproc-per-node N`` over
:mod:`stalwart.bench.ddp_worker`. With ``kill_at`` the benchmark waits until
rank 0 reports that step done and kill -9s rank 1; torchrun then stops the
other ranks and fails, and the benchmark starts it again at once, as a job
scheduler would, the ranks resuming from the newest checkpoint. Recovery is
read from the progress file: the kill to the first step the new ranks finish.

torchrun's own ``--max-restarts`` is not used: on this torch build the
restarted ranks hung in the gloo process group's creation (docs/performance.md).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from google.protobuf import json_format

from stalwart.api import coordinator


@dataclass(frozen=True)
class Progress:
    step: int
    time: float
    restart: int


@dataclass
class DdpRun:
    steps_per_s: float
    weights: dict[str, torch.Tensor]
    progress: list[Progress]
    killed_at: float | None = None
    recovery_s: float | None = None
    steps_repeated: int | None = None


def _read_progress(path: Path) -> list[Progress]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3:  # a line being written is skipped
            out.append(Progress(int(parts[0]), float(parts[1]), int(parts[2])))
    return out


def steady_steps_per_s(progress: list[Progress], warmup: int) -> float:
    """Steps/s of the first attempt from the end of step ``warmup`` to its last step."""
    first = [p for p in progress if p.restart == 0 and p.step >= warmup]
    if len(first) < 2:
        return 0.0
    return (first[-1].step - first[0].step) / (first[-1].time - first[0].time)


def _torchrun(folder: Path, world: int, ckpt_every: int, log, attempt: int) -> subprocess.Popen:
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={world}",
            "-m", "stalwart.bench.ddp_worker", "--dir", str(folder),
            "--ckpt-every", str(ckpt_every)]  # fmt: skip
    env = dict(
        os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", STALWART_DDP_ATTEMPT=str(attempt)
    )
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)  # fmt: skip


def _wait_for_step(folder: Path, proc: subprocess.Popen, step: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(p.step >= step for p in _read_progress(folder / "progress")):
            return
        if proc.poll() is not None:
            raise RuntimeError(f"torchrun exited ({proc.returncode}) before step {step}")
        time.sleep(0.01)
    raise TimeoutError(f"DDP did not reach step {step} within {timeout_s:.0f}s")


def run(
    spec: coordinator.JobSpec, warmup: int, kill_at: int | None = None,
    ckpt_every: int = 10, timeout_s: float = 600.0,
) -> DdpRun:  # fmt: skip
    folder = Path(tempfile.mkdtemp(prefix="stalwart-ddp-", dir="/dev/shm"))
    try:
        (folder / "spec.json").write_text(json_format.MessageToJson(spec))
        with open(folder / "torchrun.log", "wb") as log:
            killed_at = None
            proc = _torchrun(folder, spec.num_slots, ckpt_every, log, 0)
            try:
                if kill_at is not None:
                    _wait_for_step(folder, proc, kill_at, timeout_s)
                    victim = int((folder / "pid.1").read_text())
                    killed_at = time.time()
                    os.kill(victim, signal.SIGKILL)
                    proc.wait(timeout=timeout_s)  # torchrun stops the others and fails
                    proc = _torchrun(folder, spec.num_slots, ckpt_every, log, 1)
                proc.wait(timeout=timeout_s)
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        progress = _read_progress(folder / "progress")
        weights = torch.load(folder / "final.pt", weights_only=True)
        result = DdpRun(steady_steps_per_s(progress, warmup), weights, progress, killed_at)
        if killed_at is not None:
            _recovery(result)
        return result
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _recovery(result: DdpRun) -> None:
    """Kill -> first step done after the restart, and the steps done twice."""
    before = [p for p in result.progress if p.restart == 0]
    after = [p for p in result.progress if p.restart > 0]
    if not after:
        return
    result.recovery_s = after[0].time - result.killed_at
    result.steps_repeated = max(0, before[-1].step - after[0].step + 1) if before else 0
