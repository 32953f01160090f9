"""Server-side JobSpec defaults, the GetShardMap pieces and the reflection pool."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from services.coordinator.shardpieces import ShardPieces, pieces_of
from stalwart import jobspec, shardmap
from stalwart.api import common, coordinator, paramserver
from stalwart.cli.jobs import build_spec
from stalwart.reflection import SymbolPool


@pytest.mark.parametrize("model", [*sorted(jobspec.MODEL_DEFAULTS), "pkg.mod:build"])
def test_an_empty_spec_gets_what_the_cli_would_send(model):
    got = jobspec.normalized(coordinator.JobSpec(model=model))
    sent = build_spec(model, None, None, None, 0, None, None, 0.0, None, "sync", 0, 1, [])
    # what the coordinator makes of the CLI's spec (it also resolves the schedule)
    assert got == jobspec.normalized(sent)
    for field in ("num_slots", "steps", "batch_size", "micro_batches", "num_shards"):
        assert getattr(got, field) == getattr(sent, field), field
    assert (got.optimizer.kind, got.optimizer.lr) == (sent.optimizer.kind, sent.optimizer.lr)


def test_fields_that_are_set_are_kept():
    spec = coordinator.JobSpec(
        model="mlp", num_slots=4, steps=9, batch_size=3, num_shards=2,
        optimizer=common.OptimizerSpec(kind=common.OPTIMIZER_KIND_SGD, lr=0.25),
        consistency=common.ConsistencySpec(mode=common.CONSISTENCY_MODE_ASYNC),
    )  # fmt: skip
    assert jobspec.normalized(spec) == spec


def test_a_default_clip_is_left_out_of_a_sharded_job_and_an_asked_one_refused():
    one = jobspec.normalized(coordinator.JobSpec(model="char-lm"))
    assert one.optimizer.clip_grad_norm == 1.0  # char-lm's default
    sharded = jobspec.normalized(coordinator.JobSpec(model="char-lm", num_shards=2))
    assert sharded.optimizer.clip_grad_norm == 0.0
    jobspec.validate_job_spec(sharded, max_slots=64, max_steps=10_000)
    asked = coordinator.JobSpec(
        model="char-lm", num_shards=2, optimizer=common.OptimizerSpec(clip_grad_norm=0.5)
    )
    with pytest.raises(Exception, match="clip_grad_norm needs num_shards 1"):
        jobspec.validate_job_spec(jobspec.normalized(asked), max_slots=64, max_steps=10_000)


def test_set_fields_still_fail_validation():
    spec = jobspec.normalized(coordinator.JobSpec(model="mlp", num_slots=-1))
    with pytest.raises(Exception, match="num_slots must be >= 1"):
        jobspec.validate_job_spec(spec, max_slots=64, max_steps=10_000)


def test_pieces_from_stored_names_equal_the_computed_map():
    tensors = [
        shardmap.TensorShape("emb.weight", (1000, 4096), 1000 * 4096 * 4),  # split by rows
        shardmap.TensorShape("fc.weight", (10, 10), 400),
        shardmap.TensorShape("fc.bias", (10,), 40),
    ]
    want = shardmap.build_shard_map(tensors, 3, split_bytes=1024)
    stored: dict[int, list[str]] = {0: [], 1: [], 2: []}
    for p in want:
        stored[p.shard].append(p.piece_name)
    got = pieces_of(stored)
    assert [(p.tensor_name, p.piece_name, p.shard, p.row_start, p.row_end) for p in got] == [
        (p.tensor_name, p.piece_name, p.shard, p.row_start, p.row_end) for p in want
    ]
    assert any(p.row_end > 0 for p in got)  # the split tensor really was split


def test_reflection_pool_finds_methods_and_refuses_unknown_ones():
    pool = SymbolPool()
    name = pool.FindFileContainingSymbol("stalwart.v1.CoordinatorService.CreateJob").name
    assert name == "stalwart/v1/coordinator.proto"
    assert pool.FindFileContainingSymbol("stalwart.v1.JobSpec").name == name
    for missing in ("stalwart.v1.CoordinatorService.NoSuch", "no.such.Service.Call", "Nothing"):
        with pytest.raises(KeyError):
            pool.FindFileContainingSymbol(missing)


@pytest.mark.parametrize(
    ("fields", "want"),
    [
        ({"corruption_kind": coordinator.CORRUPTION_KIND_ABFT}, "abft"),
        ({"corruption_kind": coordinator.CORRUPTION_KIND_NONFINITE, "kind": "crc"}, "nonfinite"),
        ({"kind": "duplicate_compute"}, "duplicate_compute"),  # the deprecated string still works
    ],
)
def test_corruption_kind_from_the_enum_then_the_string(fields, want):
    from services.coordinator.sdcguard import _kind_of

    assert _kind_of(coordinator.ReportCorruptionRequest(**fields)) == want


@pytest.mark.parametrize("fields", [{}, {"kind": "gremlins"}, {"corruption_kind": 99}])
def test_corruption_kind_missing_or_unknown_is_invalid(fields):
    from services.coordinator.sdcguard import _kind_of
    from stalwart.errors import ErrorKind, StalwartError

    with pytest.raises(StalwartError) as info:
        _kind_of(coordinator.ReportCorruptionRequest(**fields))
    assert info.value.kind is ErrorKind.INVALID_ARGUMENT


class _NotRegistered(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.NOT_FOUND


def test_piece_names_are_asked_once_per_primary_and_not_cached_before_registration():
    asked: list[str] = []
    registered = {"a:1": False, "b:2": True}

    class Stub:
        def __init__(self, address):
            self.address = address

        async def GetFingerprint(self, request, timeout):
            asked.append(self.address)
            if not registered[self.address]:
                raise _NotRegistered()
            return paramserver.GetFingerprintResponse(
                tensors=[paramserver.TensorFingerprint(name="w", kind="param")]
            )

    pieces = ShardPieces(Stub)
    assert asyncio.run(pieces.pieces("j", {0: "a:1"})) == []  # not registered yet
    registered["a:1"] = True
    first = asyncio.run(pieces.pieces("j", {0: "a:1"}))
    assert [p.piece_name for p in first] == ["w"]
    assert asyncio.run(pieces.pieces("j", {0: "a:1"})) == first
    assert asyncio.run(pieces.pieces("j", {0: "b:2"})) == first  # a new primary is asked
    assert asked == ["a:1", "a:1", "b:2"]
