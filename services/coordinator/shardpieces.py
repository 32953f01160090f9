"""The pieces of a job's shard map, as GetShardMap answers them.

The coordinator never builds a model, so it does not compute the map from
tensor shapes as the trainers do (stalwart.shardmap): it reads what each shard
group's primary holds. A piece's stored name says everything a client needs:
"<tensor>" for a whole tensor, "<tensor>#rows=<start>:<end>" for a row range.
"""

from __future__ import annotations

import asyncio
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence

import grpc

from stalwart.api import common, paramserver
from stalwart.errors import ErrorKind, StalwartError

_ROWS = re.compile(r"(?P<tensor>.+)#rows=(?P<start>\d+):(?P<end>\d+)")
FINGERPRINT_TIMEOUT_S = 10.0
NAMES_CACHED = 1024  # (job, shard, primary) answers kept; the oldest go first


def piece_of(name: str, shard: int) -> common.ShardPiece:
    """The ShardPiece a stored name describes (shardmap.build_shard_map's naming)."""
    rows = _ROWS.fullmatch(name)
    if rows is None:
        return common.ShardPiece(tensor_name=name, piece_name=name, shard=shard)
    return common.ShardPiece(
        tensor_name=rows["tensor"], piece_name=name, shard=shard,
        row_start=int(rows["start"]), row_end=int(rows["end"]),
    )  # fmt: skip


def pieces_of(names_by_shard: Mapping[int, Sequence[str]]) -> list[common.ShardPiece]:
    """Every piece, ordered by (shard, piece name) like stalwart.shardmap."""
    pieces = [piece_of(n, shard) for shard, names in names_by_shard.items() for n in names]
    return sorted(pieces, key=lambda p: (p.shard, p.piece_name))


class ShardPieces:
    """Asks each group's primary which parameters it holds for a job."""

    def __init__(self, stub: Callable[[str], object]) -> None:
        self._stub = stub
        # A job's parameter names never change once its model is registered, and
        # GetFingerprint hashes the whole state to answer: ask each primary once.
        self._names_seen: OrderedDict[tuple[str, int, str], list[str]] = OrderedDict()

    async def pieces(self, job_id: str, primaries: Mapping[int, str]) -> list[common.ShardPiece]:
        """Empty while the job's model is not registered yet (no primary knows the job).

        Raises UNAVAILABLE when a group has no primary or its primary does not answer.
        """
        shards = sorted(primaries)
        names = await asyncio.gather(*(self._names(job_id, s, primaries[s]) for s in shards))
        if any(n is None for n in names):
            return []
        return pieces_of(dict(zip(shards, names, strict=True)))

    async def _names(self, job_id: str, shard: int, address: str) -> list[str] | None:
        if not address:
            raise StalwartError(ErrorKind.UNAVAILABLE, f"shard group {shard} has no primary")
        key = (job_id, shard, address)
        if key in self._names_seen:
            self._names_seen.move_to_end(key)
            return self._names_seen[key]
        names = await self._ask_names(job_id, shard, address)
        if names is not None:
            self._names_seen[key] = names
            if len(self._names_seen) > NAMES_CACHED:
                self._names_seen.popitem(last=False)
        return names

    async def _ask_names(self, job_id: str, shard: int, address: str) -> list[str] | None:
        request = paramserver.GetFingerprintRequest(job_id=job_id)
        try:
            answer = await self._stub(address).GetFingerprint(
                request, timeout=FINGERPRINT_TIMEOUT_S
            )
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise StalwartError(
                ErrorKind.UNAVAILABLE,
                f"shard group {shard}: primary {address} answered {exc.code().name}: {exc.details()}",
            ) from None
        return sorted(t.name for t in answer.tensors if t.kind == "param")
