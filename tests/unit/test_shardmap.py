"""Shard map: deterministic routing, row splits, balance, bitwise split/join."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from stalwart import shardmap
from stalwart.shardmap import Piece, TensorShape, build_shard_map


def model(seed: int = 0) -> dict[str, torch.Tensor]:
    """A small model: two 'large' matrices (by a low split threshold), smaller bits."""
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(10, 8, generator=g),  # 320 bytes
        "fc1.weight": torch.randn(7, 6, generator=g),  # 168 bytes
        "fc1.bias": torch.randn(7, generator=g),
        "fc2.weight": torch.randn(3, 7, generator=g),  # 84 bytes
        "fc2.bias": torch.randn(3, generator=g),
        "norm.scale": torch.randn((), generator=g),
        "steps": torch.arange(4, dtype=torch.int64),
        "mask": torch.rand(5, generator=g) > 0.5,
        "half": torch.randn(6, 2, generator=g).to(torch.bfloat16),
        "empty": torch.zeros(0, 3),
        "fc3.bias": torch.randn(7, generator=g),  # ties fc1.bias: ties go by name
        "counts": torch.zeros(3, dtype=torch.int32),  # ties fc2.bias
    }


SPLIT = 150  # embed.weight and fc1.weight split; the rest whole


def coverage(pieces: list[Piece], shapes: list[TensorShape]) -> None:
    """Every tensor is covered exactly once: one whole piece, or disjoint row ranges."""
    by_name = {t.name: t for t in shapes}
    assert {p.tensor_name for p in pieces} == set(by_name)
    assert len({p.piece_name for p in pieces}) == len(pieces)
    for name, group in itertools.groupby(
        sorted(pieces, key=lambda p: (p.tensor_name, p.row_start)), key=lambda p: p.tensor_name
    ):
        group = list(group)
        if len(group) == 1 and group[0].whole:
            continue
        assert not any(p.whole for p in group)
        rows = by_name[name].shape[0]
        assert group[0].row_start == 0
        assert group[-1].row_end == rows
        for a, b in itertools.pairwise(group):
            assert a.row_end == b.row_start
        assert all(p.row_end > p.row_start for p in group)


def test_num_shards_must_be_positive():
    with pytest.raises(ValueError):
        build_shard_map([], 0)


def test_empty_model():
    assert build_shard_map([], 3) == []


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_deterministic_and_independent_of_dict_order(k):
    tensors = model()
    shapes = shardmap.shapes_of(tensors)
    first = build_shard_map(shapes, k, SPLIT)
    rng = random.Random(k)
    for _ in range(5):
        names = list(tensors)
        rng.shuffle(names)
        shuffled = {n: tensors[n] for n in names}
        assert build_shard_map(shardmap.shapes_of(shuffled), k, SPLIT) == first
    assert build_shard_map(list(reversed(shapes)), k, SPLIT) == first
    # output order is canonical: by shard, then piece name
    assert first == sorted(first, key=lambda p: (p.shard, p.piece_name))


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_every_tensor_covered_exactly_once(k):
    shapes = shardmap.shapes_of(model())
    pieces = build_shard_map(shapes, k, SPLIT)
    coverage(pieces, shapes)
    assert all(0 <= p.shard < k for p in pieces)


def test_one_shard_holds_everything_whole():
    tensors = model()
    pieces = build_shard_map(shardmap.shapes_of(tensors), 1, split_bytes=1)
    assert all(p.whole and p.shard == 0 for p in pieces)
    assert sorted(p.piece_name for p in pieces) == sorted(tensors)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_split_join_round_trip_bitwise(k):
    tensors = model(seed=k)
    pieces = build_shard_map(shardmap.shapes_of(tensors), k, SPLIT)
    per_shard = shardmap.split(tensors, pieces)
    assert len(per_shard) == k
    held = [name for shard in per_shard for name in shard]
    assert sorted(held) == sorted(p.piece_name for p in pieces)
    joined = shardmap.join(per_shard, pieces)
    assert set(joined) == set(tensors)
    for name, t in tensors.items():
        got = joined[name]
        assert got.dtype == t.dtype and got.shape == t.shape
        assert torch.equal(got.reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8))


@pytest.mark.parametrize("k", [2, 3, 4])
def test_large_tensors_split_by_rows_into_near_equal_ranges(k):
    tensors = {
        "big": torch.arange(11 * 4, dtype=torch.float32).reshape(11, 4),
        "tiny": torch.ones(2),
    }
    pieces = build_shard_map(shardmap.shapes_of(tensors), k, split_bytes=100)
    big = sorted((p for p in pieces if p.tensor_name == "big"), key=lambda p: p.row_start)
    assert [p.shard for p in big] == list(range(k))
    sizes = [p.row_end - p.row_start for p in big]
    assert sum(sizes) == 11
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the extra rows go to the first groups
    for p in big:
        assert p.piece_name == f"big#rows={p.row_start}:{p.row_end}"
    per_shard = shardmap.split(tensors, pieces)
    for p in big:
        piece = per_shard[p.shard][p.piece_name]
        assert torch.equal(piece, tensors["big"][p.row_start : p.row_end])
        assert piece.data_ptr() == tensors["big"][p.row_start].data_ptr()  # a view, no copy


def test_split_threshold_is_inclusive_and_needs_enough_rows():
    t = TensorShape("w", (4, 25), 400)
    assert len(build_shard_map([t], 2, split_bytes=400)) == 2
    assert len(build_shard_map([t], 2, split_bytes=401)) == 1
    few_rows = TensorShape("w", (3, 100), 1200)
    pieces = build_shard_map([few_rows], 4, split_bytes=1)
    assert len(pieces) == 1 and pieces[0].whole
    scalar = TensorShape("s", (), 1 << 30)
    assert build_shard_map([scalar], 2, split_bytes=1)[0].whole


@pytest.mark.parametrize("k", [2, 3, 4])
def test_small_tensors_are_balanced(k):
    shapes = [TensorShape(f"t{i:02d}", (10,), 40) for i in range(4 * k + 1)]
    pieces = build_shard_map(shapes, k)
    counts = [sum(p.shard == s for p in pieces) for s in range(k)]
    assert max(counts) - min(counts) <= 1
    assert counts[0] == max(counts)  # ties go to the lowest shard index


def test_small_tensors_greedy_by_size():
    shapes = [
        TensorShape("a", (9,), 90),
        TensorShape("b", (5,), 50),
        TensorShape("c", (4,), 40),
        TensorShape("d", (3,), 30),
        TensorShape("e", (2,), 20),
    ]
    pieces = {p.tensor_name: p.shard for p in build_shard_map(shapes, 2)}
    # a -> 0 (90); b -> 1 (50); c -> 1 (90); d -> 0 (120); e -> 1 (110)
    assert pieces == {"a": 0, "b": 1, "c": 1, "d": 0, "e": 1}
    loads = [0, 0]
    for t in shapes:
        loads[pieces[t.name]] += t.nbytes
    assert max(loads) - min(loads) <= max(t.nbytes for t in shapes)


def test_split_tensors_count_towards_load():
    shapes = [
        TensorShape("big", (4, 100), 1600),
        TensorShape("x", (1,), 4),
        TensorShape("y", (1,), 4),
    ]
    pieces = {p.piece_name: p.shard for p in build_shard_map(shapes, 2, split_bytes=1000)}
    assert pieces["x"] == 0 and pieces["y"] == 1


def test_more_shards_than_tensors_still_gives_one_dict_per_group():
    tensors = {"a": torch.ones(2), "b": torch.zeros(3)}
    pieces = build_shard_map(shardmap.shapes_of(tensors), 4)
    per_shard = shardmap.split(tensors, pieces, num_shards=4)
    assert len(per_shard) == 4
    assert per_shard[2] == {} and per_shard[3] == {}
    joined = shardmap.join(per_shard, pieces)
    assert all(torch.equal(joined[n], tensors[n]) for n in tensors)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_gradient_subset_splits_and_joins(k):
    params = model()
    pieces = build_shard_map(shardmap.shapes_of(params), k, SPLIT)
    g = torch.Generator().manual_seed(7)
    grads = {
        name: torch.randn(params[name].shape, generator=g)
        for name in ("embed.weight", "fc2.bias", "norm.scale")
    }
    per_shard = shardmap.split(grads, pieces)
    assert len(per_shard) == k
    for shard, held in enumerate(per_shard):
        expect = {p.piece_name for p in pieces if p.shard == shard and p.tensor_name in grads}
        assert set(held) == expect
    # the split tensor's row pieces go where the parameter's row pieces live
    for p in pieces:
        if p.tensor_name == "embed.weight" and not p.whole:
            assert torch.equal(
                per_shard[p.shard][p.piece_name], grads["embed.weight"][p.row_start : p.row_end]
            )
    joined = shardmap.join(per_shard, pieces)
    assert set(joined) == set(grads)
    for name, grad in grads.items():
        assert torch.equal(joined[name], grad)


def test_join_accepts_pieces_as_returned_in_any_shard_order():
    tensors = {"w": torch.arange(30.0).reshape(6, 5)}
    pieces = build_shard_map(shardmap.shapes_of(tensors), 3, split_bytes=1)
    per_shard = [
        {name: t.clone() for name, t in held.items()} for held in shardmap.split(tensors, pieces)
    ]
    assert torch.equal(shardmap.join(per_shard, list(reversed(pieces)))["w"], tensors["w"])


def test_shapes_of_reports_bytes():
    shapes = shardmap.shapes_of(
        {"a": torch.zeros(2, 3, dtype=torch.float64), "b": torch.tensor(True), "c": torch.zeros(0)}
    )
    assert shapes == [
        TensorShape("a", (2, 3), 48),
        TensorShape("b", (), 1),
        TensorShape("c", (0,), 0),
    ]
