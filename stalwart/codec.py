"""Tensor wire codec: dtype + shape + little-endian bytes, in CRC32C-checked chunks.

A tensor travels as a ``TensorSpec`` (name, dtype, shape) followed by
``TensorChunk`` messages. Encoding views the tensor's memory as bytes without
copying: :func:`encode_chunk_messages` writes each chunk's wire message
(``oneof part { TensorChunk chunk = 2; }``, the same bytes for every streaming
message of the API) with one copy straight from the tensor, where building the
protobuf objects and serializing them took three. Decoding checks every chunk's
CRC *before* copying it anywhere and checks sizes against limits *before*
allocating, so a corrupt or oversize stream is refused with nothing applied.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from stalwart import wiredtypes
from stalwart.api import common
from stalwart.crc import crc32c
from stalwart.errors import ErrorKind, StalwartError

DEFAULT_CHUNK_BYTES = 4 * 1024 * 1024

if sys.byteorder != "little":  # pragma: no cover - every supported platform is little-endian
    raise ImportError("stalwart's zero-copy codec needs a little-endian host")

DTYPES: dict[int, torch.dtype] = {
    common.DTYPE_FLOAT32: torch.float32,
    common.DTYPE_FLOAT64: torch.float64,
    common.DTYPE_FLOAT16: torch.float16,
    common.DTYPE_BFLOAT16: torch.bfloat16,
    common.DTYPE_INT64: torch.int64,
    common.DTYPE_INT32: torch.int32,
    common.DTYPE_INT16: torch.int16,
    common.DTYPE_INT8: torch.int8,
    common.DTYPE_UINT8: torch.uint8,
    common.DTYPE_BOOL: torch.bool,
}
WIRE_DTYPES: dict[torch.dtype, int] = {v: k for k, v in DTYPES.items()}


@dataclass(frozen=True)
class Limits:
    """Hard input limits, checked before any allocation."""

    max_tensor_elements: int = 1 << 31
    max_stream_bytes: int = 4 << 30
    max_tensors: int = 100_000
    max_chunks: int = 1_000_000
    max_name_length: int = 256
    max_dims: int = 8


DEFAULT_LIMITS = Limits()


_CRC32C_POLY = 0x82F63B78  # reflected Castagnoli polynomial


def _gf2_times(matrix: Sequence[int], vector: int) -> int:
    out = 0
    i = 0
    while vector:
        if vector & 1:
            out ^= matrix[i]
        vector >>= 1
        i += 1
    return out


def _gf2_square(matrix: Sequence[int]) -> list[int]:
    return [_gf2_times(matrix, column) for column in matrix]


@functools.cache
def _zero_byte_powers() -> tuple[tuple[int, ...], ...]:
    """Matrices that advance a CRC32C register over 1, 2, 4, ... 2**63 zero bytes."""
    one_bit = [_CRC32C_POLY] + [1 << i for i in range(31)]
    power = _gf2_square(_gf2_square(_gf2_square(one_bit)))  # one zero byte
    powers = [tuple(power)]
    for _ in range(63):
        power = _gf2_square(power)
        powers.append(tuple(power))
    return tuple(powers)


def crc32c_combine(crc_a: int, crc_b: int, len_b: int) -> int:
    """CRC32C of ``a + b`` from the CRC32Cs of ``a`` and ``b`` and the length of ``b``.

    Lets a stream's running CRC follow from the chunk CRCs already verified,
    instead of a second pass over every byte.
    """
    powers = _zero_byte_powers()
    bit = 0
    while len_b:
        if len_b & 1:
            crc_a = _gf2_times(powers[bit], crc_a)
        len_b >>= 1
        bit += 1
    return crc_a ^ crc_b


def to_wire_dtype(dtype: torch.dtype) -> int:
    try:
        return WIRE_DTYPES[dtype]
    except KeyError:
        raise StalwartError(ErrorKind.BAD_DTYPE, f"dtype {dtype} cannot travel") from None


def spec_of(name: str, tensor: torch.Tensor) -> common.TensorSpec:
    return common.TensorSpec(name=name, dtype=to_wire_dtype(tensor.dtype), shape=tensor.shape)


def byte_view(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes, without a copy when it is contiguous on the CPU."""
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy())


tensor_nbytes = wiredtypes.tensor_nbytes


def encode_chunks(
    tensors: Sequence[torch.Tensor], chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> Iterator[common.TensorChunk]:
    """Chunks of the given tensors, in order, each with its CRC32C."""
    for index, tensor in enumerate(tensors):
        view = byte_view(tensor)
        for offset in range(0, len(view), chunk_bytes):
            piece = bytes(view[offset : offset + chunk_bytes])
            yield common.TensorChunk(
                tensor_index=index, offset=offset, data=piece, crc32c=crc32c(piece)
            )


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def chunk_message(index: int, offset: int, data: bytes | memoryview, crc: int) -> bytes:
    """The serialized message ``{chunk: TensorChunk(index, offset, data, crc)}``.

    Byte for byte what protobuf writes for a ``PushRequest``, ``PullResponse``,
    ``RegisterModelRequest``, ``ReplicatePushRequest`` or ``InstallStateRequest``
    holding that chunk (all put it at field 2 of their ``part`` oneof), built
    with a single copy of ``data``.
    """
    head = b""
    if index:
        head += b"\x08" + _varint(index)  # uint32 tensor_index = 1
    if offset:
        head += b"\x10" + _varint(offset)  # uint64 offset = 2
    size = len(data)
    if size:
        head += b"\x1a" + _varint(size)  # bytes data = 3
    tail = b"\x25" + crc.to_bytes(4, "little") if crc else b""  # fixed32 crc32c = 4
    body = len(head) + size + len(tail)
    return b"".join((b"\x12", _varint(body), head, data, tail))  # TensorChunk chunk = 2


def encode_chunk_messages(
    tensors: Sequence[torch.Tensor], chunk_bytes: int = DEFAULT_CHUNK_BYTES, packed: bool = False
) -> Iterator[bytes]:
    """The same chunks as :func:`encode_chunks`, as serialized stream messages.

    ``packed``: chunks of ``chunk_bytes`` cut from the tensors' bytes laid end
    to end, so a model of many small tensors travels in a few messages (each
    stream message costs both ends a trip through gRPC's core); see
    ``PushHeader.packed``."""
    if packed:
        yield from _packed_chunk_messages(tensors, chunk_bytes)
        return
    for index, tensor in enumerate(tensors):
        view = byte_view(tensor)
        for offset in range(0, len(view), chunk_bytes):
            piece = view[offset : offset + chunk_bytes]
            yield chunk_message(index, offset, piece, crc32c(piece))


def _packed_chunk_messages(tensors: Sequence[torch.Tensor], chunk_bytes: int) -> Iterator[bytes]:
    pieces: list[memoryview] = []
    first = (0, 0)  # (tensor_index, offset) of the pending chunk's first byte
    size = 0
    for index, tensor in enumerate(tensors):
        view = byte_view(tensor)
        offset = 0
        while offset < len(view):
            if not pieces:
                first = (index, offset)
            take = min(chunk_bytes - size, len(view) - offset)
            pieces.append(view[offset : offset + take])
            size, offset = size + take, offset + take
            if size == chunk_bytes:
                yield _joined_chunk(first, pieces)
                pieces, size = [], 0
    if pieces:
        yield _joined_chunk(first, pieces)


def _joined_chunk(first: tuple[int, int], pieces: list[memoryview]) -> bytes:
    data = pieces[0] if len(pieces) == 1 else b"".join(pieces)  # one copy either way
    return chunk_message(first[0], first[1], data, crc32c(data))


def passthrough(serialize: Callable[[Any], bytes]) -> Callable[[Any], bytes]:
    """A gRPC serializer that sends ``bytes`` as they are (messages already
    serialized, e.g. by :func:`chunk_message`) and serializes anything else."""

    def serializer(message: Any) -> bytes:
        return message if isinstance(message, bytes) else serialize(message)

    return serializer


# Room beside one chunk for the pull header in a push's answer (PushHeader.
# answer_parameters_bytes): the settings keep the largest message at least 64 KiB
# above the chunk size.
PUSH_ANSWER_SLACK_BYTES = 32 * 1024


def push_answer(response: Any, pull_messages: Sequence[bytes]) -> bytes:
    """``response`` (a ``PushResponse``) serialized with ``pull_messages``, each a
    serialized ``PullResponse``, as its ``parameters`` (field 3, repeated): the cached
    chunks of a pull go into the answer as they are, with one copy for the join.
    Protobuf reads fields in any order and appends repeated ones, so the answer's own
    fields first and the parameters after them parse as one message."""
    parts = [response.SerializeToString()]
    for message in pull_messages:
        parts += (b"\x1a", _varint(len(message)), message)  # repeated PullResponse = 3
    return b"".join(parts)


@dataclass(frozen=True, slots=True)
class WireChunk:
    """A chunk stream message read from its wire bytes by :func:`read_chunk_message`.

    Has the fields of a ``TensorChunk``; ``data`` is a view into ``message``,
    the message as it was received, which a primary forwards to its backups as
    it is (every streaming message of the API puts the chunk at the same field).
    """

    tensor_index: int
    offset: int
    data: memoryview
    crc32c: int
    message: bytes


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """(value, position after it); (-1, -1) for one cut short or over 10 bytes."""
    value = shift = 0
    while pos < len(buf) and shift < 70:
        byte = buf[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if byte < 0x80:
            return value, pos
        shift += 7
    return -1, -1


def read_chunk_message(message: bytes, at: int = 0) -> WireChunk | None:
    """The chunk of a serialized ``{chunk: TensorChunk}`` stream message, read
    without protobuf: its data is not copied (protobuf's message copies it
    each time ``data`` is read). ``at``: where the chunk field begins (after
    fields the caller read, as a replication stream's op).

    Reads only the form :func:`chunk_message` writes (any field order, fields
    repeated or left out); None for anything else (a header, unknown fields,
    a chunk spread over several fields, bad input), for protobuf to parse.
    """
    if len(message) < at + 2 or message[at] != 0x12:  # TensorChunk chunk = 2
        return None
    size, pos = read_varint(message, at + 1)
    if pos < 0 or pos + size != len(message):
        return None
    index = offset = crc = 0
    start = end = pos
    while 0 <= pos < len(message):
        tag = message[pos]
        if tag == 0x08:
            index, pos = read_varint(message, pos + 1)
        elif tag == 0x10:
            offset, pos = read_varint(message, pos + 1)
        elif tag == 0x1A:
            size, start = read_varint(message, pos + 1)
            end = pos = start + size if start >= 0 else -1
        elif tag == 0x25 and pos + 5 <= len(message):
            crc, pos = int.from_bytes(message[pos + 1 : pos + 5], "little"), pos + 5
        else:
            return None
    if pos != len(message) or index >> 32 or offset >> 64:
        return None
    return WireChunk(index, offset, memoryview(message)[start:end], crc, message)


def chunk_reader(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """A gRPC deserializer for a chunk stream: chunk messages as :class:`WireChunk`,
    anything else (the header) by ``parse``."""

    def deserializer(message: bytes) -> Any:
        chunk = read_chunk_message(message)
        return chunk if chunk is not None else parse(message)

    return deserializer


def chunk_of(message: Any) -> WireChunk | common.TensorChunk | None:
    """The chunk a stream message carries, read either way; None if it is no chunk."""
    if isinstance(message, WireChunk):
        return message
    return message.chunk if message.WhichOneof("part") == "chunk" else None


def validate_specs(
    specs: Iterable[common.TensorSpec], limits: Limits = DEFAULT_LIMITS
) -> list[common.TensorSpec]:
    """Check names, dtypes, shapes and totals before anything is allocated."""
    specs = list(specs)
    if len(specs) > limits.max_tensors:
        raise StalwartError(
            ErrorKind.LIMIT_EXCEEDED, f"{len(specs)} tensors, limit {limits.max_tensors}"
        )
    total, seen = 0, set()
    for spec in specs:
        if not spec.name or len(spec.name) > limits.max_name_length:
            raise StalwartError(ErrorKind.INVALID_ARGUMENT, f"bad tensor name {spec.name[:64]!r}")
        if spec.name in seen:
            raise StalwartError(ErrorKind.INVALID_ARGUMENT, f"tensor {spec.name!r} sent twice")
        seen.add(spec.name)
        if len(spec.shape) > limits.max_dims or any(d < 0 for d in spec.shape):
            raise StalwartError(
                ErrorKind.BAD_SHAPE, f"bad shape {list(spec.shape)} for {spec.name}"
            )
        elements = math.prod(spec.shape)
        if elements > limits.max_tensor_elements:
            raise StalwartError(
                ErrorKind.LIMIT_EXCEEDED,
                f"{spec.name} has {elements} elements, limit {limits.max_tensor_elements}",
            )
        total += tensor_nbytes(spec)
    if total > limits.max_stream_bytes:
        raise StalwartError(
            ErrorKind.LIMIT_EXCEEDED, f"stream of {total} bytes, limit {limits.max_stream_bytes}"
        )
    return specs


class ChunkAssembler:
    """Rebuilds tensors from a stream of chunks, checking order, size and CRC.

    Chunks must come tensor by tensor, each tensor's bytes contiguous from
    offset 0, as :func:`encode_chunks` sends them; with ``packed`` a chunk may
    run on into the following tensors (``PushHeader.packed``). Call
    :meth:`finish` at the end of the stream: it refuses a truncated stream.
    """

    def __init__(
        self,
        specs: Sequence[common.TensorSpec],
        limits: Limits = DEFAULT_LIMITS,
        packed: bool = False,
    ):
        self.specs = validate_specs(specs, limits)
        self.packed = packed
        self._limits = limits
        self._tensors = [torch.empty(tuple(s.shape), dtype=DTYPES[s.dtype]) for s in self.specs]
        self._views = [_writable_bytes(t) for t in self._tensors]
        self._index = 0
        self._offset = 0
        self._chunks = 0
        self._crc = 0  # running CRC32C over every chunk's bytes, for dedupe keys

    def add(self, chunk: common.TensorChunk | WireChunk) -> memoryview:
        """Check and place one chunk; returns its bytes (for a chunk inside one
        tensor, the tensor memory it now fills)."""
        self._chunks += 1
        if self._chunks > self._limits.max_chunks:
            raise StalwartError(ErrorKind.LIMIT_EXCEEDED, f"over {self._limits.max_chunks} chunks")
        data = chunk.data
        if crc32c(data) != chunk.crc32c:
            raise StalwartError(
                ErrorKind.CHECKSUM_MISMATCH,
                f"chunk at offset {chunk.offset} of tensor #{chunk.tensor_index} failed its CRC32C",
            )
        self._skip_finished()
        if self._index == len(self._views):
            raise StalwartError(
                ErrorKind.BAD_STREAM,
                f"chunk for tensor #{chunk.tensor_index} after the last of "
                f"{len(self._views)} tensors",
            )
        if chunk.tensor_index != self._index or chunk.offset != self._offset:
            raise StalwartError(
                ErrorKind.BAD_STREAM,
                f"chunk for tensor #{chunk.tensor_index} offset {chunk.offset} out of order "
                f"(expected tensor #{self._index} offset {self._offset})",
            )
        view = self._views[self._index]
        end = self._offset + len(data)
        if end <= len(view):
            placed = view[self._offset : end]
            placed[:] = data
            self._offset = end
        elif self.packed:
            placed = memoryview(data)
            self._place_across(placed)
        else:
            raise StalwartError(
                ErrorKind.BAD_SHAPE,
                f"tensor {self.specs[self._index].name} got {end} bytes, "
                f"its shape holds {len(view)}",
            )
        self._crc = crc32c_combine(self._crc, chunk.crc32c, len(data))
        return placed

    def _place_across(self, data: memoryview) -> None:
        """A packed chunk that runs on past the end of the current tensor."""
        done = 0
        while done < len(data):
            self._skip_finished()
            if self._index == len(self._views):
                raise StalwartError(
                    ErrorKind.BAD_SHAPE,
                    f"packed stream carries {len(data) - done} bytes more than its "
                    f"{len(self._views)} tensors hold",
                )
            view = self._views[self._index]
            take = min(len(view) - self._offset, len(data) - done)
            view[self._offset : self._offset + take] = data[done : done + take]
            self._offset += take
            done += take

    def _skip_finished(self) -> None:
        while self._index < len(self._views) and self._offset == len(self._views[self._index]):
            self._index += 1
            self._offset = 0

    @property
    def complete(self) -> bool:
        """Every byte of every tensor arrived."""
        self._skip_finished()
        return self._index == len(self._views)

    def finish(self) -> dict[str, torch.Tensor]:
        self._skip_finished()
        if self._index != len(self._views):
            spec = self.specs[self._index]
            raise StalwartError(
                ErrorKind.TRUNCATED_STREAM,
                f"stream ended after {self._offset} of {tensor_nbytes(spec)} bytes "
                f"of tensor {spec.name}",
            )
        return {s.name: t for s, t in zip(self.specs, self._tensors, strict=True)}

    @property
    def payload_crc32c(self) -> int:
        return self._crc


def _writable_bytes(tensor: torch.Tensor) -> memoryview:
    return memoryview(tensor.reshape(-1).view(torch.uint8).numpy())


def tensor_crc32c(tensor: torch.Tensor) -> int:
    return crc32c(byte_view(tensor))
