"""One rank of the torchrun + DDP baseline of ``stalwart bench ddp`` (``python -m`` under torchrun).

The same arithmetic a Stalwart sync job does, as a DDP user would write it:
the job's model, batches keyed by (seed, rank, step), the optimizer built by
:func:`stalwart.optim.build`, gradients reduced over ranks as the job's
``OptimizerSpec.reduction`` says Stalwart reduces its slots: MEAN (the default) is
DDP's own averaging, SUM a comm hook that all-reduces without the division.
Recovery is DDP's usual one: rank 0 writes a checkpoint (weights, optimizer
state, next step) every ``--ckpt-every`` steps, atomically; when the job is
started again after a crash, the ranks resume from it.

Rank 0 appends ``<step> <time.time()> <attempt>`` to ``progress`` after
every step and writes ``final.pt`` at the end; every rank writes its pid to
``pid.<rank>`` so the benchmark can kill one.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from google.protobuf import json_format
from torch.nn.parallel import DistributedDataParallel

from stalwart import optim, training
from stalwart.api import common, coordinator
from stalwart.models import resolve


def _sum_hook(_state, bucket):
    """All-reduce the bucket as a sum (DDP's default divides by the world size)."""
    work = dist.all_reduce(bucket.buffer(), async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def _save(path: Path, model, opt, next_step: int) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": next_step}, tmp)
    tmp.replace(path)  # a crash mid-write leaves the previous checkpoint whole


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--ckpt-every", type=int, default=10)
    args = parser.parse_args()
    training.make_deterministic(1)
    spec = json_format.Parse((args.dir / "spec.json").read_text(), coordinator.JobSpec())
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    (args.dir / f"pid.{rank}").write_text(str(os.getpid()))
    task = resolve(spec)
    module = task.build_model(spec.seed)
    opt = optim.build(spec.optimizer, list(module.parameters()))
    ckpt, start = args.dir / "ckpt.pt", 0
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=True)
        module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
    model = DistributedDataParallel(module)
    if spec.optimizer.reduction == common.GRAD_REDUCTION_SUM:
        model.register_comm_hook(None, _sum_hook)
    restart = os.environ.get("STALWART_DDP_ATTEMPT", "0")
    progress = open(args.dir / "progress", "a", buffering=1) if rank == 0 else None  # noqa: SIM115
    for step in range(start, spec.steps):
        x, y = task.batch(spec.seed, rank, step, spec.batch_size)
        opt.zero_grad(set_to_none=True)
        task.loss(model, x, y).backward()
        opt.step()
        if rank == 0:
            if args.ckpt_every and (step + 1) % args.ckpt_every == 0:
                _save(ckpt, module, opt, step + 1)
            progress.write(f"{step} {time.time():.6f} {restart}\n")
    if rank == 0:
        progress.close()
        torch.save({n: p.detach() for n, p in module.named_parameters()}, args.dir / "final.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
