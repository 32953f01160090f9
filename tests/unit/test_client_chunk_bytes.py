"""A shard group client's chunk size: 0 is the default, as on the wire; one out of the
range the paramservers take is refused at construction with the range, instead of an
error from deep inside the first push (``range() arg 3 must not be zero`` for 0)."""

from __future__ import annotations

import pytest

from stalwart import codec
from stalwart.checkpoint import MAX_CHUNK_BYTES, MIN_CHUNK_BYTES
from stalwart.client.paramserver import ShardGroupClient
from stalwart.errors import ErrorKind, StalwartError


@pytest.mark.parametrize(
    ("asked", "kept"),
    [(0, codec.DEFAULT_CHUNK_BYTES), (MIN_CHUNK_BYTES, MIN_CHUNK_BYTES),
     (MAX_CHUNK_BYTES, MAX_CHUNK_BYTES)],
)  # fmt: skip
def test_chunk_sizes_in_range_are_kept(asked: int, kept: int) -> None:
    assert ShardGroupClient(["127.0.0.1:1"], chunk_bytes=asked).chunk_bytes == kept


@pytest.mark.parametrize("asked", [-1, 1, MIN_CHUNK_BYTES - 1, MAX_CHUNK_BYTES + 1])
def test_chunk_sizes_out_of_range_are_refused(asked: int) -> None:
    with pytest.raises(StalwartError) as info:
        ShardGroupClient(["127.0.0.1:1"], chunk_bytes=asked)
    assert info.value.kind is ErrorKind.INVALID_ARGUMENT
    assert f"got {asked}" in info.value.message and str(MIN_CHUNK_BYTES) in info.value.message
