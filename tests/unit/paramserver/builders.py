"""Small jobs, gradients and a plain-torch reference for the paramserver unit tests."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from services.paramserver.job import JobModel
from stalwart import codec
from stalwart.api import common, paramserver

NUM_SLOTS = 3


def initial_params(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "fc.weight": torch.randn(4, 3, generator=g),
        "fc.bias": torch.randn(4, generator=g),
        "scale": torch.randn((), generator=g),
        "head.weight": torch.randn(2, 4, generator=g, dtype=torch.float64),
    }


def header(
    optimizer: common.OptimizerSpec,
    params: Mapping[str, torch.Tensor],
    mode: int = common.CONSISTENCY_MODE_SYNC,
    num_slots: int = NUM_SLOTS,
    staleness: int = 0,
    policy: int = common.STALENESS_POLICY_UNSPECIFIED,
) -> paramserver.ModelHeader:
    return paramserver.ModelHeader(
        job_id="job-1",
        optimizer=optimizer,
        consistency=common.ConsistencySpec(mode=mode, staleness=staleness, policy=policy),
        num_slots=num_slots,
        epoch=1,
        tensors=[codec.spec_of(n, t) for n, t in params.items()],
    )


def _summing(kw: dict) -> dict:
    """These tests compare with torch.optim fed the plain sum of the slots' gradients."""
    return {"reduction": common.GRAD_REDUCTION_SUM, **kw}


def sgd(**kw) -> common.OptimizerSpec:
    return common.OptimizerSpec(kind=common.OPTIMIZER_KIND_SGD, **_summing(kw))


def adam(**kw) -> common.OptimizerSpec:
    return common.OptimizerSpec(kind=common.OPTIMIZER_KIND_ADAM, **_summing(kw))


def adamw(**kw) -> common.OptimizerSpec:
    return common.OptimizerSpec(kind=common.OPTIMIZER_KIND_ADAMW, **_summing(kw))


def grads_for(params: Mapping[str, torch.Tensor], step: int, slot: int) -> dict[str, torch.Tensor]:
    """Deterministic gradients; on odd steps slot pushes leave out ``fc.bias``."""
    g = torch.Generator().manual_seed(1000 * step + slot)
    return {
        name: torch.randn(p.shape, generator=g, dtype=p.dtype)
        for name, p in params.items()
        if not (step % 2 == 1 and name == "fc.bias")
    }


def own(grads: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Fresh copies, as a push decoded off the wire would be: the job may sum into them."""
    return {name: g.clone() for name, g in grads.items()}


def sync_step(job: JobModel, step: int, grads: list[dict[str, torch.Tensor]]) -> int:
    """Stage every slot's push for ``step`` (slot order reversed), then commit."""
    for slot in reversed(range(len(grads))):
        assert job.ready_entries(step, 0) is None
        job.stage(step, slot, crc=step * 10 + slot, grads=own(grads[slot]))
    entries = job.ready_entries(step, len(grads) - 1)
    assert [(e.step, e.slot) for e in entries] == [(step, s) for s in range(len(grads))]
    return job.apply(entries)


def reference_step(
    optimizer: torch.optim.Optimizer,
    params: Mapping[str, torch.Tensor],
    grads: list[dict[str, torch.Tensor]],
) -> None:
    """Plain torch: sum in slot order (g0.clone(), += g1, += g2), then step."""
    for name, p in params.items():
        present = [g[name] for g in grads if name in g]
        if not present:
            p.grad = None
            continue
        total = present[0].clone()
        for more in present[1:]:
            total += more
        p.grad = total
    optimizer.step()


def through_the_wire(job: JobModel, epoch: int = 2) -> JobModel:
    """Export a job's state as an InstallState stream would carry it, and import it."""
    head = paramserver.InstallStateHeader.FromString(job.install_header(epoch).SerializeToString())
    tensors = job.state_tensors()
    assert [s.name for s in head.tensors] == list(tensors)
    asm = codec.ChunkAssembler(head.tensors)
    for chunk in codec.encode_chunks(list(tensors.values()), chunk_bytes=7):
        asm.add(common.TensorChunk.FromString(chunk.SerializeToString()))
    return JobModel.from_install(head, asm.finish())


def assert_same_tensors(got: Mapping[str, torch.Tensor], want: Mapping[str, torch.Tensor]) -> None:
    assert set(got) == set(want)
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        assert torch.equal(got[name], want[name]), name
