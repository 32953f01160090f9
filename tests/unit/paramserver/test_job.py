"""JobModel: admission checks, sync/async/ssp bookkeeping, dedupe window, state transfer."""

from __future__ import annotations

import math

import pytest
import torch

from services.paramserver import job as jobmod
from services.paramserver.consistency import Mode, Verdict
from services.paramserver.job import Entry, JobModel, check_finite, rules_from
from stalwart import codec, gradients
from stalwart.api import common
from stalwart.errors import ErrorKind, StalwartError

from .builders import (
    NUM_SLOTS,
    assert_same_tensors,
    grads_for,
    header,
    initial_params,
    own,
    reference_step,
    sgd,
    sync_step,
    through_the_wire,
)


def make_job(mode=common.CONSISTENCY_MODE_SYNC, spec=None, **kw) -> JobModel:
    init = initial_params()
    return JobModel(header(spec or sgd(lr=0.1, momentum=0.9), init, mode=mode, **kw), init)


def kind_of(fn, *args) -> ErrorKind:
    with pytest.raises(StalwartError) as info:
        fn(*args)
    return info.value.kind


# --- construction and rules --------------------------------------------------------


def test_rules_from_header():
    init = initial_params()
    rules = rules_from(
        header(
            sgd(lr=0.1),
            init,
            mode=common.CONSISTENCY_MODE_SSP,
            num_slots=4,
            staleness=3,
            policy=common.STALENESS_POLICY_REFUSE,
        )
    )
    assert (rules.mode, rules.num_slots, rules.staleness, rules.refuse_when_stale) == (
        Mode.SSP,
        4,
        3,
        True,
    )
    wait = rules_from(header(sgd(lr=0.1), init, mode=common.CONSISTENCY_MODE_SSP, staleness=1))
    assert wait.refuse_when_stale is False
    assert rules_from(header(sgd(lr=0.1), init, mode=common.CONSISTENCY_MODE_ASYNC)).mode is (
        Mode.ASYNC
    )


@pytest.mark.parametrize(
    "kw",
    [
        {"mode": common.CONSISTENCY_MODE_UNSPECIFIED},
        {"mode": 17},
        {"num_slots": 0},
        {"num_slots": -2},
        {"mode": common.CONSISTENCY_MODE_SSP, "staleness": -1},
    ],
    ids=["mode-unspecified", "mode-unknown", "no-slots", "negative-slots", "ssp-negative"],
)
def test_bad_model_headers(kw):
    init = initial_params()
    bad = header(sgd(lr=0.1), init, **kw)
    assert kind_of(rules_from, bad) is ErrorKind.INVALID_ARGUMENT
    assert kind_of(JobModel, bad, init) is ErrorKind.INVALID_ARGUMENT


def test_job_copies_its_initial_tensors():
    init = initial_params()
    job = JobModel(header(sgd(lr=0.1, momentum=0.9), init), init)
    before = {n: t.clone() for n, t in init.items()}
    sync_step(job, 0, [grads_for(init, 0, s) for s in range(NUM_SLOTS)])
    assert_same_tensors(init, before)
    assert job.job_id == "job-1"
    assert job.version == 1
    assert job.clocks == [1, 1, 1]
    assert job.state_bytes() == sum(
        t.numel() * t.element_size() for t in job.state_tensors().values()
    )
    # parameters plus one momentum buffer each
    assert job.state_bytes() == 2 * sum(t.numel() * t.element_size() for t in init.values())


# --- admission checks ----------------------------------------------------------------


def spec(name, dtype=common.DTYPE_FLOAT32, shape=(4, 3)) -> common.TensorSpec:
    return common.TensorSpec(name=name, dtype=dtype, shape=list(shape))


def test_check_grad_specs_accepts_matching_specs_and_subsets():
    job = make_job()
    init = initial_params()
    job.check_grad_specs([codec.spec_of(n, t) for n, t in init.items()])
    job.check_grad_specs([spec("fc.weight")])
    job.check_grad_specs([])


@pytest.mark.parametrize(
    "bad,kind",
    [
        (spec("fc.weights"), ErrorKind.BAD_SHAPE),
        (spec(""), ErrorKind.BAD_SHAPE),
        (spec("fc.weight", shape=(3, 4)), ErrorKind.BAD_SHAPE),
        (spec("fc.weight", shape=(12,)), ErrorKind.BAD_SHAPE),
        (spec("fc.weight", shape=(4, 3, 1)), ErrorKind.BAD_SHAPE),
        (spec("scale", shape=(1,)), ErrorKind.BAD_SHAPE),
        (spec("fc.bias", shape=()), ErrorKind.BAD_SHAPE),
        (spec("fc.weight", dtype=common.DTYPE_FLOAT64), ErrorKind.BAD_DTYPE),
        (spec("fc.weight", dtype=common.DTYPE_BFLOAT16), ErrorKind.BAD_DTYPE),
        (spec("head.weight", dtype=common.DTYPE_FLOAT32, shape=(2, 4)), ErrorKind.BAD_DTYPE),
    ],
    ids=[
        "unknown-name",
        "empty-name",
        "transposed",
        "flattened",
        "extra-dim",
        "scalar-as-vector",
        "vector-as-scalar",
        "float64-for-float32",
        "bfloat16-for-float32",
        "float32-for-float64",
    ],
)
def test_check_grad_specs_rejects(bad, kind):
    job = make_job()
    got = kind_of(job.check_grad_specs, [spec("fc.bias", shape=(4,)), bad])
    assert got is kind
    assert got.code.name == "INVALID_ARGUMENT"


def bf16_job() -> JobModel:
    """A job whose pushes carry float32 parameters' gradients as bfloat16."""
    init = initial_params()
    h = header(sgd(lr=0.1, momentum=0.9), init)
    h.gradient_dtype = common.DTYPE_BFLOAT16
    return JobModel(h, init)


@pytest.mark.parametrize(
    "bad",
    [
        spec("fc.weight"),  # float32 where the job said bfloat16
        spec("fc.weight", dtype=common.DTYPE_FLOAT16),
        spec("head.weight", dtype=common.DTYPE_BFLOAT16, shape=(2, 4)),  # a float64 parameter
    ],
    ids=["float32-in-a-bf16-job", "float16-in-a-bf16-job", "bfloat16-for-float64"],
)
def test_a_bf16_jobs_pushes_carry_bfloat16_for_float32_parameters_only(bad):
    """ModelHeader.gradient_dtype (JobSpec.gradient_dtype): one dtype per tensor is right."""
    job = bf16_job()
    job.check_grad_specs([
        spec("fc.weight", dtype=common.DTYPE_BFLOAT16),
        spec("head.weight", dtype=common.DTYPE_FLOAT64, shape=(2, 4)),
    ])  # fmt: skip
    assert kind_of(job.check_grad_specs, [bad]) is ErrorKind.BAD_DTYPE


def test_an_unknown_gradient_dtype_is_refused_at_registration():
    init = initial_params()
    h = header(sgd(lr=0.1), init)
    h.gradient_dtype = common.DTYPE_FLOAT16
    assert kind_of(JobModel, h, init) is ErrorKind.INVALID_ARGUMENT


def test_bfloat16_pushes_are_widened_and_applied_as_their_float32_values():
    """Staged bfloat16 gradients become float32 (exactly), so a step of bfloat16 pushes
    ends bitwise equal to the same step fed their widened values as float32."""
    init = initial_params()
    narrow = [gradients.narrowed(grads_for(init, 0, k), common.DTYPE_BFLOAT16)
              for k in range(NUM_SLOTS)]  # fmt: skip
    assert narrow[0]["fc.weight"].dtype == torch.bfloat16
    assert narrow[0]["head.weight"].dtype == torch.float64  # only float32 narrows
    wide = [{n: g.to(init[n].dtype) for n, g in push.items()} for push in narrow]
    assert not torch.equal(wide[0]["fc.weight"], grads_for(init, 0, 0)["fc.weight"])
    via_wire, as_float32 = bf16_job(), make_job()
    sync_step(via_wire, 0, narrow)
    assert via_wire.pending == {}
    sync_step(as_float32, 0, wide)
    assert_same_tensors(via_wire.params, as_float32.params)
    assert all(p.dtype == init[n].dtype for n, p in via_wire.params.items())


def test_check_slot():
    job = make_job()
    job.check_slot(0, 0)
    job.check_slot(7, NUM_SLOTS - 1)
    assert kind_of(job.check_slot, 0, NUM_SLOTS) is ErrorKind.INVALID_ARGUMENT
    assert kind_of(job.check_slot, 0, -1) is ErrorKind.INVALID_ARGUMENT
    assert kind_of(job.check_slot, -1, 0) is ErrorKind.INVALID_ARGUMENT


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_check_finite_rejects_nan_and_inf(dtype, bad):
    good = torch.ones(3, 4, dtype=dtype)
    poisoned = good.clone()
    poisoned[2, 1] = bad
    with pytest.raises(StalwartError) as info:
        check_finite({"a": good, "b": poisoned})
    assert info.value.kind is ErrorKind.NON_FINITE
    assert "b" in info.value.message
    assert kind_of(check_finite, {"s": torch.tensor(bad, dtype=dtype)}) is ErrorKind.NON_FINITE


def test_check_finite_accepts_finite_and_non_float():
    check_finite(
        {
            "f": torch.tensor([torch.finfo(torch.float32).max, -0.0, 1e-45]),
            "h": torch.tensor([65504.0], dtype=torch.float16),
            "i": torch.tensor([2**62], dtype=torch.int64),
            "m": torch.tensor([True, False]),
            "e": torch.zeros(0),
        }
    )


# --- sync -----------------------------------------------------------------------------


def test_sync_buffers_until_every_slot_pushed():
    job = make_job()
    init = initial_params()
    before = {n: t.clone() for n, t in job.params.items()}
    grads = [grads_for(init, 0, s) for s in range(NUM_SLOTS)]
    assert job.pushed_slots() == []
    for slot in (2, 0):
        assert job.judge(0, slot, 0, crc=slot) is Verdict.ACCEPT
        job.stage(0, slot, slot, own(grads[slot]))
        assert job.ready_entries(0, slot) is None
    assert job.pushed_slots() == [0, 2]  # what GetReplicaStatus reports: slot 1 is missing
    assert_same_tensors(job.params, before)
    assert job.version == 0
    job.stage(0, 1, 1, own(grads[1]))
    entries = job.ready_entries(0, 1)
    assert entries == [Entry(0, 0, 0), Entry(0, 1, 1), Entry(0, 2, 2)]
    assert job.has_entries(entries)
    assert not job.has_entries([Entry(0, 1, 99)])
    assert job.apply(entries) == 1
    assert job.pending == {}
    assert job.pushed_slots() == []  # none yet for the next step
    assert job.clocks == [1, 1, 1]
    assert not torch.equal(job.params["fc.weight"], before["fc.weight"])


def test_sync_verdicts_after_a_commit():
    job = make_job()
    init = initial_params()
    sync_step(job, 0, [grads_for(init, 0, s) for s in range(NUM_SLOTS)])
    assert job.judge(0, 1, 0, crc=1) is Verdict.DUPLICATE  # sync_step used crc 10*step+slot
    assert job.judge(0, 1, 0, crc=2) is Verdict.CONFLICT
    assert job.judge(1, 1, 1, crc=5) is Verdict.ACCEPT
    assert job.judge(1, 1, 0, crc=5) is Verdict.STALE_BASE
    assert job.judge(2, 1, 1, crc=5) is Verdict.AHEAD


def test_sync_parameter_without_gradient_is_left_alone():
    job = make_job(spec=sgd(lr=0.1))
    init = initial_params()
    sync_step(job, 0, [grads_for(init, 0, s) for s in range(NUM_SLOTS)])
    bias = job.params["fc.bias"].clone()
    sync_step(job, 1, [grads_for(init, 1, s) for s in range(NUM_SLOTS)])  # no fc.bias on odd
    assert torch.equal(job.params["fc.bias"], bias)
    assert job.param_versions["fc.bias"] == 1
    assert job.param_versions["fc.weight"] == 2
    assert set(job.changed_since(1)) == {"fc.weight", "scale", "head.weight"}
    assert set(job.changed_since(0)) == set(init)
    assert job.changed_since(2) == []
    assert all(p.grad is None for p in job.params.values())


def test_sync_slot_order_matters_bitwise():
    """The sum is taken in slot order: staging order does not change the result."""
    init = initial_params()
    grads = [grads_for(init, 0, s) for s in range(NUM_SLOTS)]
    a = JobModel(header(sgd(lr=1.0), init), init)
    b = JobModel(header(sgd(lr=1.0), init), init)
    for slot in (0, 1, 2):
        a.stage(0, slot, slot, own(grads[slot]))
    for slot in (1, 2, 0):
        b.stage(0, slot, slot, own(grads[slot]))
    a.apply(a.ready_entries(0, 2))
    b.apply(b.ready_entries(0, 0))
    assert_same_tensors(a.params, b.params)
    # and the sum order is observable: summing in another order is not bitwise equal
    other = {n: t.clone() for n, t in init.items()}
    opt = torch.optim.SGD(list(other.values()), lr=1.0, foreach=False)
    reference_step(opt, other, [grads[2], grads[1], grads[0]])
    assert any(not torch.equal(other[n], a.params[n]) for n in init)


# --- async and ssp ----------------------------------------------------------------------


def async_push(job: JobModel, step: int, slot: int, crc: int, grads) -> int:
    assert job.judge(step, slot, job.version, crc) is Verdict.ACCEPT
    job.stage(step, slot, crc, own(grads))
    entries = job.ready_entries(step, slot)
    assert entries == [Entry(step, slot, crc)]
    return job.apply(entries)


def test_async_clocks_advance_per_slot_and_replays_are_duplicates():
    spec = sgd(lr=0.05, momentum=0.5)
    job = make_job(common.CONSISTENCY_MODE_ASYNC, spec=spec)
    init = initial_params()
    ref = {n: t.clone() for n, t in init.items()}
    ref_opt = torch.optim.SGD(list(ref.values()), lr=0.05, momentum=0.5, foreach=False)
    order = [(0, 0), (0, 1), (1, 0), (2, 0), (0, 2), (1, 1)]
    for i, (step, slot) in enumerate(order):
        g = grads_for(init, step, slot)
        assert async_push(job, step, slot, crc=100 * step + slot, grads=g) == i + 1
        reference_step(ref_opt, ref, [g])
    assert job.version == len(order)
    assert job.clocks == [3, 2, 1]
    assert_same_tensors(job.params, ref)
    for step, slot in order:
        assert job.judge(step, slot, 0, crc=100 * step + slot) is Verdict.DUPLICATE
        assert job.judge(step, slot, 0, crc=7) is Verdict.CONFLICT
    assert job.judge(3, 0, 0, crc=1) is Verdict.ACCEPT
    assert job.judge(4, 0, 0, crc=1) is Verdict.AHEAD
    assert job.judge(1, 2, 0, crc=1) is Verdict.ACCEPT
    assert job.judge(2, 2, 0, crc=1) is Verdict.AHEAD
    assert job.pending == {}


@pytest.mark.parametrize(
    "policy,verdict",
    [
        (common.STALENESS_POLICY_UNSPECIFIED, Verdict.WAIT),
        (common.STALENESS_POLICY_WAIT, Verdict.WAIT),
        (common.STALENESS_POLICY_REFUSE, Verdict.TOO_STALE),
    ],
    ids=["unspecified-waits", "wait", "refuse"],
)
def test_ssp_bounds_the_fastest_slot(policy, verdict):
    job = make_job(common.CONSISTENCY_MODE_SSP, staleness=1, policy=policy)
    init = initial_params()
    async_push(job, 0, 0, crc=1, grads=grads_for(init, 0, 0))
    async_push(job, 1, 0, crc=2, grads=grads_for(init, 1, 0))
    assert job.clocks == [2, 0, 0]
    assert job.judge(2, 0, job.version, crc=3) is verdict
    async_push(job, 0, 1, crc=4, grads=grads_for(init, 0, 1))
    assert job.judge(2, 0, job.version, crc=3) is verdict  # slot 2 is still the slowest
    async_push(job, 0, 2, crc=5, grads=grads_for(init, 0, 2))
    assert job.judge(2, 0, job.version, crc=3) is Verdict.ACCEPT


# --- dedupe window and state transfer ---------------------------------------------------


def test_dedupe_window_keeps_recent_conflicts_detectable(monkeypatch):
    monkeypatch.setattr(jobmod, "DEDUPE_WINDOW", 4)
    job = make_job(common.CONSISTENCY_MODE_ASYNC, num_slots=2, spec=sgd(lr=0.01))
    init = initial_params()
    for step in range(4):
        for slot in range(2):
            async_push(job, step, slot, crc=10 * step + slot, grads=grads_for(init, step, slot))
    assert list(job.applied) == [(2, 0), (2, 1), (3, 0), (3, 1)]
    for step in (2, 3):
        for slot in range(2):
            assert job.judge(step, slot, 0, crc=10 * step + slot) is Verdict.DUPLICATE
            assert job.judge(step, slot, 0, crc=999) is Verdict.CONFLICT
    # older keys fell out: a replay is still never applied again, but cannot be compared
    assert job.judge(0, 0, 0, crc=999) is Verdict.DUPLICATE


def test_default_dedupe_window_holds_many_steps():
    assert jobmod.DEDUPE_WINDOW >= 1024


def test_install_header_carries_counters_and_dedupe_keys():
    job = make_job(common.CONSISTENCY_MODE_ASYNC)
    init = initial_params()
    async_push(job, 0, 0, crc=11, grads=grads_for(init, 0, 0))
    async_push(job, 0, 2, crc=12, grads=grads_for(init, 0, 2))
    async_push(job, 1, 2, crc=13, grads=grads_for(init, 1, 2))
    head = job.install_header(epoch=9)
    assert head.epoch == 9
    assert head.version == 3
    assert list(head.slot_clocks) == [1, 0, 2]
    assert [(e.step, e.slot, e.payload_crc32c) for e in head.applied] == [
        (0, 0, 11),
        (0, 2, 12),
        (1, 2, 13),
    ]
    assert head.model == job.header
    assert [s.name for s in head.tensors] == list(job.state_tensors())
    assert [s.name for s in head.tensors][: len(init)] == list(init)  # parameters first

    copy = through_the_wire(job)
    assert copy.version == 3
    assert copy.clocks == [1, 0, 2]
    assert dict(copy.applied) == dict(job.applied)
    assert copy.judge(1, 2, 0, crc=13) is Verdict.DUPLICATE
    assert copy.judge(1, 2, 0, crc=14) is Verdict.CONFLICT  # exactly once across failover
    assert copy.judge(1, 0, 0, crc=1) is Verdict.ACCEPT
    assert copy.changed_since(2) == list(init)
    assert_same_tensors(copy.state_tensors(), job.state_tensors())


def test_from_install_without_clocks_starts_them_at_zero():
    job = make_job()
    head = job.install_header(epoch=1)
    del head.slot_clocks[:]
    copy = JobModel.from_install(head, job.state_tensors())
    assert copy.clocks == [0] * NUM_SLOTS


def test_from_install_copies_rather_than_shares():
    job = make_job()
    init = initial_params()
    sync_step(job, 0, [grads_for(init, 0, s) for s in range(NUM_SLOTS)])
    tensors = job.state_tensors()
    copy = JobModel.from_install(job.install_header(epoch=1), tensors)
    sync_step(copy, 1, [grads_for(init, 1, s) for s in range(NUM_SLOTS)])
    assert not torch.equal(copy.params["fc.weight"], job.params["fc.weight"])
    assert job.version == 1 and copy.version == 2


def test_entry_proto_round_trip():
    e = Entry(step=5, slot=2, crc=0xFFFFFFFF)
    proto = common.CommitEntry.FromString(e.to_proto().SerializeToString())
    assert Entry.from_proto(proto) == e


# --- a synchronous step's update, forwarded summed ------------------------------------


def _with_buffer(name: str = "scale") -> JobModel:
    init = initial_params()
    head = header(sgd(lr=0.1, momentum=0.9), init)
    head.buffer_names.append(name)
    return JobModel(head, init)


def _staged(job: JobModel, step: int) -> list[Entry]:
    for slot in range(NUM_SLOTS):
        job.stage(step, slot, crc=step * 10 + slot, grads=own(grads_for(job.params, step, slot)))
    return job.ready_entries(step, NUM_SLOTS - 1)


def _over_the_wire(reduced: jobmod.Reduced, buffers: frozenset[str]) -> jobmod.Reduced:
    """The reduced update as a backup decodes it from the forwarded chunks."""
    tensors = reduced.tensors()
    asm = codec.ChunkAssembler([codec.spec_of(n, t) for n, t in tensors.items()])
    for chunk in codec.encode_chunks(list(tensors.values()), chunk_bytes=5):
        asm.add(common.TensorChunk.FromString(chunk.SerializeToString()))
    return jobmod.Reduced.split(asm.finish(), buffers)


def test_forwards_sums_only_where_a_step_sums_several_pushes():
    assert make_job().forwards_sums
    assert not make_job(num_slots=1).forwards_sums
    assert not make_job(mode=common.CONSISTENCY_MODE_ASYNC).forwards_sums
    assert not make_job(mode=common.CONSISTENCY_MODE_SSP, staleness=1).forwards_sums


def test_reduce_leaves_the_buffered_pushes_as_they_were():
    job = _with_buffer()
    entries = _staged(job, 0)
    before = {k: own(v[1]) for k, v in job.pending.items()}
    reduced = job.reduce(entries)
    for key, grads in before.items():
        assert_same_tensors(job.pending[key][1], grads)
    assert "scale" in reduced.buffers and "scale" not in reduced.grads
    total = before[(0, 0)]["fc.weight"].clone()
    total += before[(0, 1)]["fc.weight"]
    total += before[(0, 2)]["fc.weight"]
    assert torch.equal(reduced.grads["fc.weight"], total)


def test_a_backup_applying_the_forwarded_sum_ends_bitwise_equal_to_its_primary():
    primary, backup = _with_buffer(), _with_buffer()
    for step in range(4):
        entries = _staged(primary, step)
        reduced = primary.reduce(entries)
        keys = [(e.step, e.slot) for e in entries]
        primary.stage_sum(primary.version, keys, reduced)
        # the backup holds none of the pushes, only the sum (decoded before the primary's
        # apply changes the tensors it was encoded from)
        backup.stage_sum(step, keys, _over_the_wire(reduced, backup.buffers))
        assert backup.has_entries(entries)
        assert primary.apply(entries) == backup.apply(entries) == step + 1
        assert_same_tensors(backup.state_tensors(), primary.state_tensors())
        assert backup.applied == primary.applied and backup.clocks == primary.clocks
    plain = _with_buffer()
    for step in range(4):
        plain.apply(_staged(plain, step))
    assert_same_tensors(plain.state_tensors(), primary.state_tensors())


def test_a_sum_staged_for_another_version_or_other_pushes_is_not_applied():
    job = make_job()
    entries = _staged(job, 0)
    bogus = jobmod.Reduced({n: torch.full_like(p, 7.0) for n, p in job.params.items()}, {})
    keys = [(e.step, e.slot) for e in entries]
    reference = make_job()
    reference.apply(_staged(reference, 0))
    for version, staged_keys in [(5, keys), (0, keys[:2])]:
        other = make_job()
        other_entries = _staged(other, 0)
        other.stage_sum(version, staged_keys, bogus)
        other.apply(other_entries)  # from its own pushes
        assert_same_tensors(other.params, reference.params)
    empty = make_job()
    empty.stage_sum(1, keys, bogus)  # version 1: the job is at 0
    assert not empty.has_entries(entries)


def test_a_backup_holds_only_forwarded_pushes_a_commit_could_name():
    job = make_job(common.CONSISTENCY_MODE_ASYNC)
    async_push(job, 0, 0, crc=1, grads=grads_for(initial_params(), 0, 0))
    assert job.clocks == [1, 0, 0]
    ahead = jobmod.FORWARD_AHEAD
    assert job.may_hold_forward(1, 0) and job.may_hold_forward(1 + ahead, 0)
    assert job.may_hold_forward(0, 1)  # each slot by its own clock
    assert not job.may_hold_forward(0, 0)  # applied here: a duplicate at the primary
    assert not job.may_hold_forward(2 + ahead, 0)  # refused there as ahead
    assert not job.may_hold_forward(10**12, 1)
    assert not job.may_hold_forward(0, NUM_SLOTS) and not job.may_hold_forward(0, -1)


def test_a_sync_backup_holds_forwards_by_the_version():
    job = make_job(common.CONSISTENCY_MODE_SYNC)
    assert all(job.may_hold_forward(0, slot) for slot in range(NUM_SLOTS))
    assert not job.may_hold_forward(jobmod.FORWARD_AHEAD + 1, 0)
