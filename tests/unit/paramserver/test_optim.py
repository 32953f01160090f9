"""Optimizers on the paramserver: bitwise equal to torch.optim, spec validation, state transfer."""

from __future__ import annotations

import math

import pytest
import torch

from services.paramserver import optim
from services.paramserver.job import JobModel, combined_fingerprint
from stalwart.api import common
from stalwart.errors import ErrorKind, StalwartError

from .builders import (
    NUM_SLOTS,
    adam,
    adamw,
    assert_same_tensors,
    grads_for,
    header,
    initial_params,
    reference_step,
    sgd,
    sync_step,
    through_the_wire,
)

STEPS = 6

# (id, wire spec, the same optimizer written directly against torch.optim)
OPTIMIZERS = [
    (
        "sgd",
        sgd(lr=0.1),
        lambda ps: torch.optim.SGD(ps, lr=0.1, foreach=False),
    ),
    (
        "sgd-momentum",
        sgd(lr=0.05, momentum=0.9, dampening=0.1),
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, dampening=0.1, foreach=False),
    ),
    (
        "sgd-nesterov",
        sgd(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.01),
        lambda ps: torch.optim.SGD(
            ps, lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.01, foreach=False
        ),
    ),
    (
        "sgd-weight-decay",
        sgd(lr=0.1, weight_decay=0.05),
        lambda ps: torch.optim.SGD(ps, lr=0.1, weight_decay=0.05, foreach=False),
    ),
    (
        "adam",
        adam(lr=0.01, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.01),
        lambda ps: torch.optim.Adam(
            ps, lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.01, foreach=False
        ),
    ),
    (
        "adam-wire-defaults",
        adam(lr=0.001),
        lambda ps: torch.optim.Adam(ps, lr=0.001, betas=(0.9, 0.999), eps=1e-8, foreach=False),
    ),
    (
        "adamw",
        adamw(lr=0.01, weight_decay=0.1),
        lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1, foreach=False),
    ),
    (
        "adamw-betas",
        adamw(lr=0.02, beta1=0.85, beta2=0.95, eps=1e-7, weight_decay=0.02),
        lambda ps: torch.optim.AdamW(
            ps, lr=0.02, betas=(0.85, 0.95), eps=1e-7, weight_decay=0.02, foreach=False
        ),
    ),
]
IDS = [o[0] for o in OPTIMIZERS]
CASES = [o[1:] for o in OPTIMIZERS]


def run(spec, make_ref, steps=STEPS, interrupt_at=None):
    """N sync steps through JobModel and through plain torch; returns (job, reference)."""
    init = initial_params()
    job = JobModel(header(spec, init), init)
    ref_params = {n: t.clone() for n, t in init.items()}
    ref_opt = make_ref(list(ref_params.values()))
    for step in range(steps):
        if step == interrupt_at:
            job = through_the_wire(job)
        grads = [grads_for(init, step, slot) for slot in range(NUM_SLOTS)]
        assert sync_step(job, step, grads) == step + 1
        reference_step(ref_opt, ref_params, grads)
    return job, ref_params


@pytest.mark.parametrize("spec,make_ref", CASES, ids=IDS)
def test_sync_steps_bitwise_equal_to_torch_optim(spec, make_ref):
    init = initial_params()
    job, ref = run(spec, make_ref)
    assert job.version == STEPS
    assert_same_tensors(job.params, ref)
    for name in init:  # the test has teeth: training moved every parameter
        assert not torch.equal(job.params[name], init[name])


@pytest.mark.parametrize("spec,make_ref", CASES, ids=IDS)
@pytest.mark.parametrize("interrupt_at", [1, 4])
def test_state_transfer_midway_is_bitwise_invisible(spec, make_ref, interrupt_at):
    straight, ref = run(spec, make_ref)
    resumed, _ = run(spec, make_ref, interrupt_at=interrupt_at)
    assert resumed.version == straight.version == STEPS
    assert_same_tensors(resumed.params, ref)
    assert_same_tensors(resumed.state_tensors(), straight.state_tensors())
    assert resumed.fingerprints() == straight.fingerprints()


@pytest.mark.parametrize("spec,make_ref", CASES, ids=IDS)
def test_fingerprints_equal_for_equal_state_and_differ_after_a_step(spec, make_ref):
    job, _ = run(spec, make_ref, steps=3)
    copy = through_the_wire(job)
    prints = job.fingerprints()
    assert prints == copy.fingerprints()
    assert combined_fingerprint(prints) == combined_fingerprint(copy.fingerprints())
    assert {p.name for p in prints} == set(job.state_tensors())
    for p in prints:
        expected_kind = "param" if p.name in job.params else p.name.rpartition("/")[2]
        assert p.kind == expected_kind

    init = initial_params()
    sync_step(job, 3, [grads_for(init, 3, slot) for slot in range(NUM_SLOTS)])
    after = job.fingerprints()
    assert after != prints
    changed = {p.name for p, q in zip(prints, after, strict=True) if p.crc32c != q.crc32c}
    assert "fc.weight" in changed
    assert combined_fingerprint(after) != combined_fingerprint(prints)


def test_optimizer_state_is_exported_by_name():
    init = initial_params()
    job = JobModel(header(adam(lr=0.01), init), init)
    assert set(job.state_tensors()) == set(init)  # no state before the first step
    sync_step(job, 0, [grads_for(init, 0, s) for s in range(NUM_SLOTS)])
    state = job.state_tensors()
    for name in init:
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert f"{name}/{key}" in state
    assert state["fc.weight/step"].item() == 1.0

    momentum = JobModel(header(sgd(lr=0.1, momentum=0.9), init), init)
    sync_step(momentum, 0, [grads_for(init, 0, s) for s in range(NUM_SLOTS)])
    assert {k for k in momentum.state_tensors() if "/" in k} == {
        f"{n}/momentum_buffer" for n in init
    }


def test_import_state_copies_and_rejects_unknown_parameters():
    init = initial_params()
    job = JobModel(header(sgd(lr=0.1, momentum=0.5), init), init)
    sync_step(job, 0, [grads_for(init, 0, s) for s in range(NUM_SLOTS)])
    exported = {k: v for k, v in job.state_tensors().items() if "/" in k}
    other = JobModel(header(sgd(lr=0.1, momentum=0.5), init), init)
    optim.import_state(other.optimizer, other.params, exported)
    buf = other.optimizer.state[other.params["fc.weight"]]["momentum_buffer"]
    assert torch.equal(buf, exported["fc.weight/momentum_buffer"])
    assert buf.data_ptr() != exported["fc.weight/momentum_buffer"].data_ptr()
    with pytest.raises(StalwartError) as info:
        optim.import_state(other.optimizer, other.params, {"nope/momentum_buffer": buf})
    assert info.value.kind is ErrorKind.INVALID_ARGUMENT


VALID = [
    sgd(lr=0.1),
    sgd(lr=1e-4, momentum=0.0, dampening=1.0),
    sgd(lr=0.1, momentum=0.99, nesterov=True),
    adam(lr=1e-3),
    adam(lr=1e-3, beta1=0.0, beta2=0.0, eps=0.0, weight_decay=0.0),
    adamw(lr=1e-3, beta1=0.5, beta2=0.9, eps=1e-6, weight_decay=0.1),
]


@pytest.mark.parametrize("spec", VALID, ids=lambda s: str(s).replace("\n", " "))
def test_valid_specs(spec):
    optim.validate(spec)
    assert isinstance(optim.build(spec, [torch.zeros(2)]), torch.optim.Optimizer)


INVALID = [
    ("no-kind", common.OptimizerSpec(lr=0.1)),
    ("unknown-kind", common.OptimizerSpec(kind=42, lr=0.1)),
    ("lr-zero", sgd(lr=0.0)),
    ("lr-negative", adam(lr=-1e-3)),
    ("lr-nan", adamw(lr=math.nan)),
    ("weight-decay-negative", sgd(lr=0.1, weight_decay=-0.1)),
    ("weight-decay-nan", adam(lr=0.1, weight_decay=math.nan)),
    ("momentum-one", sgd(lr=0.1, momentum=1.0)),
    ("momentum-above-one", sgd(lr=0.1, momentum=1.5)),
    ("momentum-negative", sgd(lr=0.1, momentum=-0.1)),
    ("dampening-above-one", sgd(lr=0.1, momentum=0.5, dampening=1.1)),
    ("dampening-negative", sgd(lr=0.1, dampening=-0.5)),
    ("nesterov-without-momentum", sgd(lr=0.1, nesterov=True)),
    ("nesterov-with-dampening", sgd(lr=0.1, momentum=0.9, dampening=0.1, nesterov=True)),
    ("sgd-with-beta1", sgd(lr=0.1, beta1=0.9)),
    ("sgd-with-beta2", sgd(lr=0.1, beta2=0.999)),
    ("sgd-with-eps", sgd(lr=0.1, eps=1e-8)),
    ("adam-beta1-one", adam(lr=0.1, beta1=1.0)),
    ("adam-beta1-negative", adam(lr=0.1, beta1=-0.1)),
    ("adam-beta2-one", adam(lr=0.1, beta2=1.0)),
    ("adamw-beta2-above-one", adamw(lr=0.1, beta2=1.5)),
    ("adam-beta-nan", adam(lr=0.1, beta1=math.nan)),
    ("adam-eps-negative", adam(lr=0.1, eps=-1e-8)),
    ("adam-eps-nan", adamw(lr=0.1, eps=math.nan)),
    ("adam-with-momentum", adam(lr=0.1, momentum=0.9)),
    ("adamw-with-nesterov", adamw(lr=0.1, nesterov=True)),
    ("adam-with-dampening", adam(lr=0.1, dampening=0.5)),
]


@pytest.mark.parametrize("spec", [c[1] for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_specs(spec):
    with pytest.raises(StalwartError) as info:
        optim.validate(spec)
    assert info.value.kind is ErrorKind.INVALID_ARGUMENT
    with pytest.raises(StalwartError):
        optim.build(spec, [torch.zeros(2)])
    init = initial_params()
    with pytest.raises(StalwartError) as info:
        JobModel(header(spec, init), init)
    assert info.value.kind is ErrorKind.INVALID_ARGUMENT
