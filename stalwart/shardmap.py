"""Deterministic shard map: which shard group holds which piece of which tensor.

Every client computes the same map from the same tensor specs and shard count,
so routing needs no lookup. Tensors at or above ``split_bytes`` with at least
``num_shards`` rows are split by rows into ``num_shards`` near-equal ranges, one
per shard group; smaller tensors go whole to the least-loaded group, taken in
descending size then name order (ties to the lowest shard index).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

DEFAULT_SPLIT_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class Piece:
    tensor_name: str
    piece_name: str
    shard: int
    row_start: int = 0
    row_end: int = 0  # 0, 0 means the whole tensor

    @property
    def whole(self) -> bool:
        return self.row_start == 0 and self.row_end == 0


@dataclass(frozen=True)
class TensorShape:
    name: str
    shape: tuple[int, ...]
    nbytes: int


def build_shard_map(
    tensors: Sequence[TensorShape], num_shards: int, split_bytes: int = DEFAULT_SPLIT_BYTES
) -> list[Piece]:
    if num_shards < 1:
        raise ValueError("num_shards must be >= 1")
    pieces: list[Piece] = []
    load = [0] * num_shards
    order = sorted(tensors, key=lambda t: (-t.nbytes, t.name))
    for t in order:
        rows = t.shape[0] if t.shape else 0
        if num_shards > 1 and t.nbytes >= split_bytes and rows >= num_shards:
            for shard, (start, end) in enumerate(_row_ranges(rows, num_shards)):
                name = f"{t.name}#rows={start}:{end}"
                pieces.append(Piece(t.name, name, shard, start, end))
                load[shard] += t.nbytes * (end - start) // rows
        else:
            shard = min(range(num_shards), key=lambda s: (load[s], s))
            pieces.append(Piece(t.name, t.name, shard))
            load[shard] += t.nbytes
    return sorted(pieces, key=lambda p: (p.shard, p.piece_name))


def _row_ranges(rows: int, parts: int) -> list[tuple[int, int]]:
    base, extra = divmod(rows, parts)
    ranges, start = [], 0
    for i in range(parts):
        end = start + base + (1 if i < extra else 0)
        ranges.append((start, end))
        start = end
    return ranges


def shapes_of(tensors: Mapping[str, torch.Tensor]) -> list[TensorShape]:
    return [
        TensorShape(name, tuple(t.shape), t.numel() * t.element_size())
        for name, t in tensors.items()
    ]


def split(
    tensors: Mapping[str, torch.Tensor], pieces: Sequence[Piece], num_shards: int | None = None
) -> list[dict[str, torch.Tensor]]:
    """Per shard group, the pieces it holds (row ranges are views, not copies).

    Pass ``num_shards``: a group the map gave nothing (more groups than
    tensors) still gets its own, empty, dict.
    """
    highest = max(p.shard for p in pieces) + 1 if pieces else 1
    num_shards = max(num_shards or 0, highest)
    out: list[dict[str, torch.Tensor]] = [{} for _ in range(num_shards)]
    for p in pieces:
        if p.tensor_name not in tensors:
            continue  # a push may carry a subset of the parameters
        t = tensors[p.tensor_name]
        out[p.shard][p.piece_name] = t if p.whole else t[p.row_start : p.row_end]
    return out


def join(
    per_shard: Sequence[Mapping[str, torch.Tensor]], pieces: Sequence[Piece]
) -> dict[str, torch.Tensor]:
    """Reassemble full tensors from the pieces each shard group returned."""
    found: dict[str, list[tuple[Piece, torch.Tensor]]] = {}
    for p in pieces:
        got = per_shard[p.shard].get(p.piece_name)
        if got is not None:
            found.setdefault(p.tensor_name, []).append((p, got))
    result = {}
    for name, parts in found.items():
        if len(parts) == 1 and parts[0][0].whole:
            result[name] = parts[0][1]
        else:
            parts.sort(key=lambda pt: pt[0].row_start)
            result[name] = torch.cat([t for _, t in parts], dim=0)
    return result


def join_state(
    per_shard: Sequence[Mapping[str, torch.Tensor]], pieces: Sequence[Piece]
) -> dict[str, torch.Tensor]:
    """Reassemble optimizer state named ``<piece>/<key>`` into ``<tensor>/<key>``.

    A state tensor shaped like its piece (Adam's moments, SGD's momentum) is
    joined by rows as the parameter is; any other (Adam's scalar ``step``) is
    the same on every piece of a tensor, since one push steps all of them, and
    is taken once. Pieces that disagree mean a broken replica: ValueError.
    """
    by_name = {p.piece_name: p for p in pieces}
    found: dict[tuple[str, str], list[tuple[Piece, torch.Tensor]]] = {}
    for shard_tensors in per_shard:
        for name, value in shard_tensors.items():
            piece_name, sep, key = name.rpartition("/")
            piece = by_name.get(piece_name) if sep else None
            if piece is not None:
                found.setdefault((piece.tensor_name, key), []).append((piece, value))
    out = {}
    for (tensor, key), parts in sorted(found.items()):
        parts.sort(key=lambda pt: pt[0].row_start)
        rows = [p.row_end - p.row_start for p, _ in parts]
        if len(parts) == 1:
            out[f"{tensor}/{key}"] = parts[0][1]
        elif all(v.dim() > 0 and v.shape[0] == n for (_, v), n in zip(parts, rows, strict=True)):
            out[f"{tensor}/{key}"] = torch.cat([v for _, v in parts], dim=0)
        elif all(torch.equal(v, parts[0][1]) for _, v in parts):
            out[f"{tensor}/{key}"] = parts[0][1]
        else:
            raise ValueError(f"optimizer state {tensor}/{key} differs between its pieces")
    return out
