"""The client's reading of a Pull stream (stalwart.client.paramserver._PullAssembly):
messages as received (bytes, chunks read without protobuf) and parsed messages (the
ones a push's answer carries) give the same tensors, and a bad chunk is refused."""

from __future__ import annotations

import grpc
import pytest
import torch

from stalwart import codec
from stalwart.api import paramserver
from stalwart.client.paramserver import _PullAssembly
from stalwart.errors import ErrorKind, RpcError, StalwartError


def pull_messages(tensors: dict[str, torch.Tensor], chunk_bytes: int) -> list[bytes]:
    """A Pull's serialized messages, as the paramserver streams them (packed chunks)."""
    values = list(tensors.values())
    header = paramserver.PullHeader(
        version=7, tensors=[codec.spec_of(n, t) for n, t in tensors.items()], packed=True
    )
    head = paramserver.PullResponse(header=header).SerializeToString()
    return [head, *codec.encode_chunk_messages(values, chunk_bytes, packed=True)]


def tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return {
        "a": torch.randn(33, 7, generator=g),
        "b": torch.randn(5, generator=g, dtype=torch.float64),
        "c": torch.arange(4, dtype=torch.int64),
    }


@pytest.mark.parametrize("parsed", [False, True], ids=["as-received", "parsed"])
def test_bytes_and_parsed_messages_give_the_same_tensors(parsed):
    want = tensors()
    messages = pull_messages(want, chunk_bytes=256)
    assert len(messages) > 3  # several chunks, one cut across tensors
    assembly = _PullAssembly()
    for raw in messages:
        assembly.add(paramserver.PullResponse.FromString(raw) if parsed else raw)
    version, got = assembly.result()
    assert version == 7 and sorted(got) == sorted(want)
    for name, t in want.items():
        assert got[name].dtype == t.dtype and torch.equal(got[name], t), name


def test_a_flipped_byte_in_a_received_chunk_is_refused():
    messages = pull_messages(tensors(), chunk_bytes=256)
    bad = bytearray(messages[2])
    bad[-10] ^= 0x01  # inside the data, before the CRC field
    assembly = _PullAssembly()
    assembly.add(messages[0])
    assembly.add(messages[1])
    with pytest.raises(StalwartError) as info:
        assembly.add(bytes(bad))
    assert info.value.kind is ErrorKind.CHECKSUM_MISMATCH


def test_a_chunk_before_the_header_is_an_internal_error():
    messages = pull_messages(tensors(), chunk_bytes=256)
    with pytest.raises(RpcError) as info:
        _PullAssembly().add(messages[1])
    assert info.value.code is grpc.StatusCode.INTERNAL
