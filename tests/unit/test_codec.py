"""Tensor codec: bitwise round trips, CRC checks, stream order, limits before allocation."""

from __future__ import annotations

import contextlib

import google_crc32c
import pytest
import torch

from stalwart import codec
from stalwart.api import common, paramserver
from stalwart.errors import ErrorKind, StalwartError


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes, so NaN payloads and -0.0 compare bitwise."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def assert_bitwise(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype
    assert tuple(got.shape) == tuple(want.shape)
    assert torch.equal(bits(got), bits(want))


def sample(dtype: torch.dtype, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype is torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        t = torch.randn(shape, generator=g, dtype=torch.float32).to(dtype)
        flat = t.reshape(-1)
        specials = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0], dtype=dtype)
        n = min(len(specials), flat.numel())
        flat[:n] = specials[:n]
        return t
    info = torch.iinfo(dtype)
    t = torch.randint(max(info.min, -(2**31)), min(info.max, 2**31 - 1), shape, generator=g)
    t = t.to(dtype)
    flat = t.reshape(-1)
    if flat.numel() >= 2:
        flat[0], flat[1] = info.min, info.max
    return t


def round_trip(
    tensors: dict[str, torch.Tensor],
    chunk_bytes: int = codec.DEFAULT_CHUNK_BYTES,
    limits: codec.Limits = codec.DEFAULT_LIMITS,
) -> tuple[dict[str, torch.Tensor], codec.ChunkAssembler]:
    specs = [codec.spec_of(n, t) for n, t in tensors.items()]
    asm = codec.ChunkAssembler(specs, limits)
    for chunk in codec.encode_chunks(list(tensors.values()), chunk_bytes):
        asm.add(chunk)
    return asm.finish(), asm


def raw_chunk(index: int, offset: int, data: bytes) -> common.TensorChunk:
    """A chunk with a correct CRC for whatever bytes it carries."""
    return common.TensorChunk(
        tensor_index=index, offset=offset, data=data, crc32c=google_crc32c.value(data)
    )


def chunks_of(tensors: list[torch.Tensor], chunk_bytes: int) -> list[common.TensorChunk]:
    return list(codec.encode_chunks(tensors, chunk_bytes))


def assembler_for(
    *tensors: torch.Tensor, limits=codec.DEFAULT_LIMITS, packed: bool = False
) -> codec.ChunkAssembler:
    specs = [codec.spec_of(f"t{i}", t) for i, t in enumerate(tensors)]
    return codec.ChunkAssembler(specs, limits, packed)


@contextlib.contextmanager
def raises_kind(kind: ErrorKind):
    with pytest.raises(StalwartError) as info:
        yield info
    assert info.value.kind is kind, f"got {info.value.kind}, want {kind}: {info.value}"


# --- dtypes ---------------------------------------------------------------------


def test_dtype_table_covers_every_wire_dtype():
    wire = {v for v in common.Dtype.values() if v != common.DTYPE_UNSPECIFIED}
    assert set(codec.DTYPES) == wire
    assert len(set(codec.DTYPES.values())) == len(codec.DTYPES)
    for wire_dtype, dtype in codec.DTYPES.items():
        assert codec.to_wire_dtype(dtype) == wire_dtype


def test_dtype_that_cannot_travel():
    with raises_kind(ErrorKind.BAD_DTYPE):
        codec.to_wire_dtype(torch.complex64)
    with raises_kind(ErrorKind.BAD_DTYPE):
        codec.spec_of("x", torch.zeros(2, dtype=torch.complex64))


@pytest.mark.parametrize("dtype", list(codec.DTYPES.values()), ids=str)
@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (1,), (5, 7), (2, 3, 4)], ids=str)
def test_round_trip_bitwise_every_dtype(dtype, shape):
    t = sample(dtype, shape)
    spec = codec.spec_of("w", t)
    assert spec.dtype == codec.to_wire_dtype(dtype)
    assert list(spec.shape) == list(shape)
    assert codec.tensor_nbytes(spec) == t.numel() * t.element_size()
    out, _ = round_trip({"w": t}, chunk_bytes=5)
    assert list(out) == ["w"]
    assert_bitwise(out["w"], t)


def test_bfloat16_bits_are_preserved_exactly():
    raw = torch.tensor([0x7FC1, 0xFF80, 0x8000, 0x0001, 0x3F80], dtype=torch.int32).to(torch.int16)
    t = raw.view(torch.bfloat16)  # a NaN payload, -inf, -0.0, a subnormal, 1.0
    out, _ = round_trip({"b": t}, chunk_bytes=3)
    assert torch.equal(out["b"].view(torch.int16), raw)


def test_bool_bytes_are_zero_or_one():
    t = torch.tensor([True, False, True, True])
    assert bytes(codec.byte_view(t)) == b"\x01\x00\x01\x01"
    out, _ = round_trip({"m": t})
    assert torch.equal(out["m"], t)


def test_wire_bytes_are_little_endian():
    t = torch.tensor([1, 256], dtype=torch.int32)
    assert bytes(codec.byte_view(t)) == b"\x01\x00\x00\x00\x00\x01\x00\x00"
    f = torch.tensor([1.0], dtype=torch.float32)
    assert bytes(codec.byte_view(f)) == b"\x00\x00\x80\x3f"


def test_scalar_round_trip():
    t = torch.tensor(3.25, dtype=torch.float64)
    out, _ = round_trip({"s": t}, chunk_bytes=3)
    assert out["s"].shape == ()
    assert out["s"].item() == 3.25


def test_empty_tensor_sends_no_chunks_and_still_arrives():
    empty = torch.zeros(0, 4)
    assert chunks_of([empty], 8) == []
    a, b = torch.arange(3, dtype=torch.int64), torch.arange(5, dtype=torch.int16)
    out, _ = round_trip({"a": a, "e": empty, "b": b}, chunk_bytes=4)
    assert list(out) == ["a", "e", "b"]
    assert_bitwise(out["a"], a)
    assert_bitwise(out["e"], empty)
    assert_bitwise(out["b"], b)


def test_no_tensors_at_all():
    out, asm = round_trip({})
    assert out == {}
    assert asm.payload_crc32c == 0


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.arange(24, dtype=torch.float32).reshape(4, 6).t(),
        lambda: torch.arange(40, dtype=torch.int32).reshape(5, 8)[:, ::3],
        lambda: torch.arange(3, dtype=torch.float64).expand(4, 3),
        lambda: torch.arange(60, dtype=torch.int16).reshape(3, 4, 5).permute(2, 0, 1)[1:],
    ],
    ids=["transposed", "strided", "expanded", "permuted-slice"],
)
def test_non_contiguous_inputs(make):
    t = make()
    assert not t.is_contiguous()
    out, _ = round_trip({"x": t}, chunk_bytes=7)
    assert out["x"].is_contiguous()
    assert torch.equal(out["x"], t)
    assert bytes(codec.byte_view(t)) == bytes(codec.byte_view(t.contiguous()))


@pytest.mark.parametrize("chunk_bytes", [1, 3, 4, 7, 16, 48, 96, 97, 1 << 20])
def test_chunk_sizes_that_do_and_do_not_divide(chunk_bytes):
    t = sample(torch.float32, (4, 6), seed=1)  # 96 bytes
    u = sample(torch.uint8, (13,), seed=2)
    chunks = chunks_of([t, u], chunk_bytes)
    for index, tensor in enumerate([t, u]):
        mine = [c for c in chunks if c.tensor_index == index]
        nbytes = tensor.numel() * tensor.element_size()
        assert len(mine) == -(-nbytes // chunk_bytes)
        assert [c.offset for c in mine] == list(range(0, nbytes, chunk_bytes))
        assert all(len(c.data) <= chunk_bytes for c in mine)
        assert all(c.crc32c == google_crc32c.value(c.data) for c in mine)
        assert b"".join(c.data for c in mine) == bytes(codec.byte_view(tensor))
    assert [c.tensor_index for c in chunks] == sorted(c.tensor_index for c in chunks)
    out, _ = round_trip({"t": t, "u": u}, chunk_bytes)
    assert_bitwise(out["t"], t)
    assert_bitwise(out["u"], u)


def test_byte_view_is_zero_copy_for_contiguous_cpu_tensors():
    t = torch.zeros(4, dtype=torch.int32)
    view = codec.byte_view(t)
    t[0] = 0x01020304
    assert bytes(view[:4]) == b"\x04\x03\x02\x01"


def test_tensor_crc32c_matches_bytes():
    t = sample(torch.float16, (3, 5))
    assert codec.tensor_crc32c(t) == google_crc32c.value(bytes(codec.byte_view(t)))
    assert codec.tensor_crc32c(t.t()) == google_crc32c.value(bytes(codec.byte_view(t.t())))


def test_crc32c_of_a_view_larger_than_one_slice():
    t = torch.arange(codec.DEFAULT_CHUNK_BYTES // 4 + 3, dtype=torch.int32)
    raw = bytes(codec.byte_view(t))
    assert codec.crc32c(codec.byte_view(t)) == google_crc32c.value(raw)
    assert codec.tensor_crc32c(t) == codec.crc32c(raw)
    assert codec.crc32c(memoryview(b"")) == codec.crc32c(b"") == 0


# --- corruption and stream errors --------------------------------------------------


def test_flipped_byte_is_refused_and_nothing_is_applied():
    t = sample(torch.float32, (8,))
    chunks = chunks_of([t], 8)
    asm = assembler_for(t)
    asm.add(chunks[0])
    bad = common.TensorChunk()
    bad.CopyFrom(chunks[1])
    data = bytearray(bad.data)
    data[3] ^= 0x10
    bad.data = bytes(data)
    with raises_kind(ErrorKind.CHECKSUM_MISMATCH) as info:
        asm.add(bad)
    assert info.value.kind.code.name == "DATA_LOSS"
    # the refused chunk moved nothing: the good one is still expected at its offset
    for c in chunks[1:]:
        asm.add(c)
    assert_bitwise(asm.finish()["t0"], t)


def test_wrong_crc_field_is_refused():
    t = torch.arange(4, dtype=torch.int64)
    (chunk,) = chunks_of([t], 1 << 10)
    chunk.crc32c ^= 1
    with raises_kind(ErrorKind.CHECKSUM_MISMATCH):
        assembler_for(t).add(chunk)


def test_checksum_mismatch_for_every_single_bit_flip_in_a_chunk():
    t = torch.arange(3, dtype=torch.int8)
    (chunk,) = chunks_of([t], 64)
    for i in range(len(chunk.data) * 8):
        data = bytearray(chunk.data)
        data[i // 8] ^= 1 << (i % 8)
        bad = common.TensorChunk(tensor_index=0, offset=0, data=bytes(data), crc32c=chunk.crc32c)
        with raises_kind(ErrorKind.CHECKSUM_MISMATCH):
            assembler_for(t).add(bad)


def test_truncated_stream_last_chunk_missing():
    t = sample(torch.float32, (10,))
    asm = assembler_for(t)
    for c in chunks_of([t], 16)[:-1]:
        asm.add(c)
    with raises_kind(ErrorKind.TRUNCATED_STREAM):
        asm.finish()


def test_truncated_stream_second_tensor_missing():
    a, b = torch.ones(4), torch.ones(2, dtype=torch.int64)
    asm = assembler_for(a, b)
    for c in chunks_of([a], 16):
        asm.add(c)
    with raises_kind(ErrorKind.TRUNCATED_STREAM):
        asm.finish()


def test_truncated_stream_no_chunks():
    with raises_kind(ErrorKind.TRUNCATED_STREAM):
        assembler_for(torch.tensor(1.0)).finish()


def test_out_of_order_chunks():
    t = sample(torch.float32, (8,))
    c0, c1, c2, c3 = chunks_of([t], 8)
    asm = assembler_for(t)
    asm.add(c0)
    with raises_kind(ErrorKind.BAD_STREAM):
        asm.add(c2)  # a gap
    with raises_kind(ErrorKind.BAD_STREAM):
        assembler_for(t).add(c1)  # not starting at offset 0


def test_overlapping_chunk_is_refused():
    t = sample(torch.float32, (8,))
    c0, c1, *_ = chunks_of([t], 8)
    asm = assembler_for(t)
    asm.add(c0)
    with raises_kind(ErrorKind.BAD_STREAM):
        asm.add(c0)  # replay of bytes already written
    overlap = common.TensorChunk(
        tensor_index=0, offset=4, data=c1.data, crc32c=google_crc32c.value(c1.data)
    )
    with raises_kind(ErrorKind.BAD_STREAM):
        asm.add(overlap)


def test_chunk_for_a_later_tensor_before_the_current_one_ends():
    a, b = torch.ones(4), torch.zeros(4)
    chunks_b = [c for c in chunks_of([a, b], 8) if c.tensor_index == 1]
    asm = assembler_for(a, b)
    with raises_kind(ErrorKind.BAD_STREAM):
        asm.add(chunks_b[0])


def test_chunk_for_an_earlier_tensor_after_it_ended():
    a, b = torch.ones(2), torch.zeros(2)
    chunks = chunks_of([a, b], 64)
    asm = assembler_for(a, b)
    asm.add(chunks[0])
    with raises_kind(ErrorKind.BAD_STREAM):
        asm.add(chunks[0])


def test_chunk_past_the_last_tensor_is_a_bad_stream():
    t = torch.ones(2)
    asm = assembler_for(t)
    for c in chunks_of([t], 64):
        asm.add(c)
    extra = raw_chunk(1, 0, b"xx")
    with raises_kind(ErrorKind.BAD_STREAM):
        asm.add(extra)
    assert_bitwise(asm.finish()["t0"], t)


def test_chunk_for_a_tensor_index_beyond_the_specs_in_an_empty_stream():
    asm = codec.ChunkAssembler([])
    extra = common.TensorChunk(tensor_index=0, offset=0, data=b"", crc32c=0)
    with raises_kind(ErrorKind.BAD_STREAM):
        asm.add(extra)


def test_too_many_bytes_for_a_tensor():
    t = torch.zeros(2, dtype=torch.int32)  # 8 bytes
    data = bytes(range(12))
    chunk = raw_chunk(0, 0, data)
    with raises_kind(ErrorKind.BAD_SHAPE):
        assembler_for(t).add(chunk)


def test_too_many_bytes_in_a_later_chunk():
    t = torch.zeros(3, dtype=torch.int32)  # 12 bytes
    first = bytes(8)
    second = bytes(8)
    asm = assembler_for(t)
    asm.add(raw_chunk(0, 0, first))
    with raises_kind(ErrorKind.BAD_SHAPE):
        asm.add(raw_chunk(0, 8, second))


# --- limits, before allocation ------------------------------------------------------


@pytest.fixture
def no_allocation(monkeypatch):
    """Fail the test if anything allocates a non-empty tensor through torch.empty."""
    real = torch.empty
    sizes: list[int] = []

    def spy(*args, **kwargs):
        t = real(*args, **kwargs)
        sizes.append(t.numel())
        return t

    monkeypatch.setattr(torch, "empty", spy)
    yield sizes
    assert all(n == 0 for n in sizes), f"allocated tensors of {sizes} elements"


def spec(name="w", dtype=common.DTYPE_FLOAT32, shape=(2,)) -> common.TensorSpec:
    return common.TensorSpec(name=name, dtype=dtype, shape=list(shape))


def test_huge_element_count_fails_fast_without_allocating(no_allocation):
    with raises_kind(ErrorKind.LIMIT_EXCEEDED) as info:
        codec.ChunkAssembler([spec(shape=(2**20, 2**20))])
    assert info.value.kind.code.name == "RESOURCE_EXHAUSTED"


def test_element_limit_is_inclusive(no_allocation):
    limits = codec.Limits(max_tensor_elements=6)
    codec.validate_specs([spec(shape=(2, 3))], limits)
    with raises_kind(ErrorKind.LIMIT_EXCEEDED):
        codec.ChunkAssembler([spec(shape=(7,))], limits)


def test_total_stream_bytes_limit(no_allocation):
    limits = codec.Limits(max_stream_bytes=100)
    codec.validate_specs([spec("a", shape=(25,))], limits)  # exactly 100 bytes
    with raises_kind(ErrorKind.LIMIT_EXCEEDED):
        codec.ChunkAssembler([spec("a", shape=(13,)), spec("b", shape=(13,))], limits)
    with raises_kind(ErrorKind.LIMIT_EXCEEDED):
        codec.ChunkAssembler([spec("a", common.DTYPE_FLOAT64, shape=(13,))], limits)


def test_total_stream_bytes_default_limit_without_allocating(no_allocation):
    many = [spec(f"t{i}", shape=(2**28,)) for i in range(5)]  # 5 GiB in float32
    with raises_kind(ErrorKind.LIMIT_EXCEEDED):
        codec.ChunkAssembler(many)


def test_too_many_tensors(no_allocation):
    limits = codec.Limits(max_tensors=3)
    codec.validate_specs([spec(f"t{i}") for i in range(3)], limits)
    with raises_kind(ErrorKind.LIMIT_EXCEEDED):
        codec.ChunkAssembler([spec(f"t{i}") for i in range(4)], limits)


@pytest.mark.parametrize("name", ["", "x" * 257])
def test_bad_names(name, no_allocation):
    with raises_kind(ErrorKind.INVALID_ARGUMENT):
        codec.ChunkAssembler([spec(name)])


def test_name_length_limit_is_inclusive():
    codec.validate_specs([spec("x" * 256)])
    with raises_kind(ErrorKind.INVALID_ARGUMENT):
        codec.validate_specs([spec("x" * 11)], codec.Limits(max_name_length=10))


def test_duplicate_names(no_allocation):
    with raises_kind(ErrorKind.INVALID_ARGUMENT):
        codec.ChunkAssembler([spec("a"), spec("b"), spec("a")])


def test_too_many_dims(no_allocation):
    codec.validate_specs([spec(shape=(1,) * 8)])
    with raises_kind(ErrorKind.BAD_SHAPE) as info:
        codec.ChunkAssembler([spec(shape=(1,) * 9)])
    assert info.value.kind.code.name == "INVALID_ARGUMENT"


def test_negative_dim(no_allocation):
    with raises_kind(ErrorKind.BAD_SHAPE):
        codec.ChunkAssembler([spec(shape=(4, -1))])
    with raises_kind(ErrorKind.BAD_SHAPE):
        codec.ChunkAssembler([spec(shape=(-2, -3))])  # product positive, still refused


@pytest.mark.parametrize("dtype", [common.DTYPE_UNSPECIFIED, 99])
def test_unknown_dtype(dtype, no_allocation):
    with raises_kind(ErrorKind.BAD_DTYPE):
        codec.ChunkAssembler([spec(dtype=dtype)])


def test_chunk_count_limit():
    t = torch.arange(16, dtype=torch.uint8)
    chunks = chunks_of([t], 4)
    limits = codec.Limits(max_chunks=4)
    out, _ = round_trip({"t": t}, chunk_bytes=4, limits=limits)  # exactly at the limit
    assert torch.equal(out["t"], t)
    asm = assembler_for(t, limits=codec.Limits(max_chunks=3))
    for c in chunks[:3]:
        asm.add(c)
    with raises_kind(ErrorKind.LIMIT_EXCEEDED):
        asm.add(chunks[3])


def test_chunk_count_limit_counts_empty_chunks():
    t = torch.arange(4, dtype=torch.uint8)
    asm = assembler_for(t, limits=codec.Limits(max_chunks=2))
    empty = common.TensorChunk(tensor_index=0, offset=0, data=b"", crc32c=0)
    asm.add(empty)
    asm.add(empty)
    with raises_kind(ErrorKind.LIMIT_EXCEEDED):
        asm.add(empty)


# --- payload CRC ------------------------------------------------------------------


def test_payload_crc_equal_for_equal_payloads_any_chunking():
    tensors = {"a": sample(torch.float32, (5, 3)), "b": sample(torch.int64, (4,))}
    crcs = {round_trip(tensors, chunk_bytes=cb)[1].payload_crc32c for cb in (1, 7, 64, 1 << 20)}
    assert len(crcs) == 1
    whole = b"".join(bytes(codec.byte_view(t)) for t in tensors.values())
    assert crcs == {google_crc32c.value(whole)}
    copy = {k: v.clone() for k, v in tensors.items()}
    assert round_trip(copy)[1].payload_crc32c == crcs.pop()


def test_payload_crc_differs_for_different_payloads():
    a = sample(torch.float32, (5, 3))
    b = a.clone()
    b.view(torch.int32)[2, 1] ^= 1  # one bit of one element
    crc_a = round_trip({"w": a})[1].payload_crc32c
    crc_b = round_trip({"w": b})[1].payload_crc32c
    assert crc_a != crc_b
    c = torch.zeros(5, 3)
    assert round_trip({"w": c})[1].payload_crc32c != crc_a


# --- pre-serialized chunk messages, in-place CRCs, CRC combination ------------------


@pytest.mark.parametrize("chunk_bytes", [1, 5, 64, 1 << 20])
def test_chunk_messages_are_byte_for_byte_what_protobuf_writes(chunk_bytes):
    from stalwart.api import paramserver

    tensors = [sample(torch.float32, (3, 7)), torch.zeros(0), sample(torch.int64, (300,), seed=1)]
    fast = list(codec.encode_chunk_messages(tensors, chunk_bytes))
    slow = [
        paramserver.PushRequest(chunk=c).SerializeToString()
        for c in codec.encode_chunks(tensors, chunk_bytes)
    ]
    assert fast == slow
    # the same bytes parse as every streaming message that carries chunks
    for cls in (
        paramserver.PullResponse,
        paramserver.RegisterModelRequest,
        paramserver.ReplicatePushRequest,
        paramserver.InstallStateRequest,
    ):
        parsed = [cls.FromString(m) for m in fast]
        assert [p.chunk.SerializeToString() for p in parsed] == [
            paramserver.PushRequest.FromString(m).chunk.SerializeToString() for m in slow
        ]


def test_chunk_message_fields_that_need_long_varints_and_zero_values():
    from stalwart.api import paramserver

    data = bytes(range(200)) * 700  # 140 000 bytes: a three-byte length
    for index, offset, crc in [(0, 0, 0), (1, 1, 1), (300, 2**40 + 5, 0xFFFFFFFF)]:
        want = paramserver.PushRequest(
            chunk=common.TensorChunk(tensor_index=index, offset=offset, data=data, crc32c=crc)
        ).SerializeToString()
        assert codec.chunk_message(index, offset, memoryview(data), crc) == want
    empty = paramserver.PushRequest(chunk=common.TensorChunk()).SerializeToString()
    assert codec.chunk_message(0, 0, b"", 0) == empty == b"\x12\x00"


def test_chunk_messages_round_trip_bitwise_and_a_flipped_byte_is_data_loss():
    from stalwart.api import paramserver

    t = sample(torch.float32, (64, 33))
    messages = list(codec.encode_chunk_messages([t], 1000))
    asm = assembler_for(t)
    for m in messages:
        asm.add(paramserver.PushRequest.FromString(m).chunk)
    assert_bitwise(asm.finish()["t0"], t)
    assert asm.payload_crc32c == google_crc32c.value(bytes(codec.byte_view(t)))

    # flip one payload byte of the second message: refused, nothing placed
    asm = assembler_for(t)
    asm.add(paramserver.PushRequest.FromString(messages[0]).chunk)
    bad = bytearray(messages[1])
    bad[len(bad) // 2] ^= 0x01
    with raises_kind(ErrorKind.CHECKSUM_MISMATCH) as info:
        asm.add(paramserver.PushRequest.FromString(bytes(bad)).chunk)
    assert info.value.kind.code.name == "DATA_LOSS"
    for m in messages[1:]:
        asm.add(paramserver.PushRequest.FromString(m).chunk)
    assert_bitwise(asm.finish()["t0"], t)


def test_add_returns_the_tensor_memory_the_chunk_filled():
    t = sample(torch.int16, (10,))
    asm = assembler_for(t)
    chunks = chunks_of([t], 6)
    placed = [bytes(asm.add(c)) for c in chunks]
    assert placed == [c.data for c in chunks]


def test_crc_of_tensor_memory_matches_the_crc_of_its_bytes():
    t = sample(torch.float32, (1 << 20,))
    view = codec.byte_view(t)
    want = google_crc32c.value(bytes(view))
    assert codec.crc32c(view) == want
    assert codec.crc32c(view[5:77]) == google_crc32c.value(bytes(view[5:77]))
    assert codec.crc32c(view[10:], codec.crc32c(view[:10])) == want
    assert codec.crc32c(memoryview(bytes(view))) == want  # a read-only view
    assert codec.crc32c(bytes(view[3:]), codec.crc32c(bytes(view[:3]))) == want


@pytest.mark.parametrize(
    "len_a,len_b", [(0, 0), (0, 9), (9, 0), (1, 1), (1000, 3), (17, 1 << 22), (5, (1 << 22) - 3)]
)
def test_crc32c_combine_equals_the_crc_of_the_concatenation(len_a, len_b):
    g = torch.Generator().manual_seed(len_a * 31 + len_b)
    a = bytes(torch.randint(0, 256, (len_a,), generator=g, dtype=torch.uint8).numpy())
    b = bytes(torch.randint(0, 256, (len_b,), generator=g, dtype=torch.uint8).numpy())
    got = codec.crc32c_combine(google_crc32c.value(a), google_crc32c.value(b), len_b)
    assert got == google_crc32c.value(a + b)


def test_passthrough_serializer_sends_bytes_as_they_are():
    spec = common.TensorSpec(name="w", dtype=common.DTYPE_FLOAT32, shape=[2])
    serialize = codec.passthrough(common.TensorSpec.SerializeToString)
    raw = b"\x12\x00"
    assert serialize(raw) is raw
    assert serialize(spec) == spec.SerializeToString()


def test_wire_itemsizes_match_torch():
    """stalwart.wiredtypes (torch-free, for the coordinator) agrees with torch on every dtype."""
    from stalwart import wiredtypes

    assert set(wiredtypes.ITEMSIZE) == set(codec.DTYPES)
    for wire, dtype in codec.DTYPES.items():
        assert wiredtypes.element_size(wire) == torch.empty(0, dtype=dtype).element_size()
    with raises_kind(ErrorKind.BAD_DTYPE):
        wiredtypes.element_size(max(codec.DTYPES) + 100)


# --- packed streams: chunks that run on from one tensor into the next --------------


def packed_round_trip(tensors: list[torch.Tensor], chunk_bytes: int):
    from stalwart.api import paramserver

    messages = list(codec.encode_chunk_messages(tensors, chunk_bytes, packed=True))
    chunks = [paramserver.PushRequest.FromString(m).chunk for m in messages]
    asm = assembler_for(*tensors, packed=True)
    placed = [bytes(asm.add(c)) for c in chunks]
    assert placed == [c.data for c in chunks]
    return asm.finish(), asm, chunks


MIXED = [
    sample(torch.float32, (3, 7)),
    torch.zeros(0),
    sample(torch.int64, (5,), seed=1),
    sample(torch.float16, (9,), seed=2),
    sample(torch.bool, (3,), seed=3),
]


@pytest.mark.parametrize("chunk_bytes", [1, 5, 64, 150, 1 << 20])
def test_packed_round_trip_is_bitwise_with_the_same_payload_crc(chunk_bytes):
    got, asm, chunks = packed_round_trip(MIXED, chunk_bytes)
    for i, want in enumerate(MIXED):
        assert_bitwise(got[f"t{i}"], want)
    total = sum(len(codec.byte_view(t)) for t in MIXED)
    assert len(chunks) == -(-total // chunk_bytes)  # every chunk full but the last
    unpacked = assembler_for(*MIXED)
    for c in chunks_of(MIXED, chunk_bytes):
        unpacked.add(c)
    assert asm.payload_crc32c == unpacked.payload_crc32c


def test_packed_chunks_name_the_position_of_their_first_byte():
    a, b, c = torch.zeros(3, dtype=torch.int8), torch.zeros(0), torch.ones(4, dtype=torch.int8)
    _, _, chunks = packed_round_trip([a, b, c], 5)
    assert [(ch.tensor_index, ch.offset, len(ch.data)) for ch in chunks] == [(0, 0, 5), (2, 2, 2)]


def test_a_small_model_travels_in_one_packed_chunk():
    tensors = [
        sample(torch.float32, (16, 8)),
        sample(torch.float32, (16,)),
        sample(torch.float32, (8,)),
    ]
    _, _, chunks = packed_round_trip(tensors, codec.DEFAULT_CHUNK_BYTES)
    assert len(chunks) == 1


def test_a_chunk_that_runs_on_is_refused_unless_the_stream_is_packed():
    a, b = torch.zeros(2, dtype=torch.int8), torch.zeros(2, dtype=torch.int8)
    with raises_kind(ErrorKind.BAD_SHAPE):
        assembler_for(a, b).add(raw_chunk(0, 0, bytes(4)))
    asm = assembler_for(a, b, packed=True)
    asm.add(raw_chunk(0, 0, bytes([1, 2, 3, 4])))
    got = asm.finish()
    assert got["t0"].tolist() == [1, 2] and got["t1"].tolist() == [3, 4]


def test_a_packed_stream_carrying_more_bytes_than_its_tensors_hold():
    a, b = torch.zeros(2, dtype=torch.int8), torch.zeros(2, dtype=torch.int8)
    with raises_kind(ErrorKind.BAD_SHAPE) as info:
        assembler_for(a, b, packed=True).add(raw_chunk(0, 0, bytes(5)))
    assert "1 bytes more" in info.value.message


def test_packed_chunks_out_of_order_or_truncated():
    a, b = torch.zeros(2, dtype=torch.int8), torch.zeros(3, dtype=torch.int8)
    asm = assembler_for(a, b, packed=True)
    asm.add(raw_chunk(0, 0, bytes(3)))  # ends one byte into b
    with raises_kind(ErrorKind.BAD_STREAM):
        asm.add(raw_chunk(1, 0, bytes(2)))  # b's offset 1 was expected
    asm = assembler_for(a, b, packed=True)
    asm.add(raw_chunk(0, 0, bytes(3)))
    with raises_kind(ErrorKind.TRUNCATED_STREAM):
        asm.finish()


# --- chunk messages read without protobuf (the servers' chunk streams) -------------


def _fields(chunk) -> tuple[int, int, bytes, int]:
    return chunk.tensor_index, chunk.offset, bytes(chunk.data), chunk.crc32c


def _protobuf_reads(message: bytes):
    """What protobuf makes of ``message`` as a PushRequest: its chunk's fields, or None."""
    from google.protobuf.message import DecodeError

    from stalwart.api import paramserver

    try:
        parsed = paramserver.PushRequest.FromString(message)
    except DecodeError:
        return None
    return _fields(parsed.chunk) if parsed.WhichOneof("part") == "chunk" else None


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("chunk_bytes", [1, 5, 64, 150, 1 << 20])
def test_read_chunk_message_reads_every_message_the_encoder_writes(chunk_bytes, packed):
    for message in codec.encode_chunk_messages(MIXED, chunk_bytes, packed):
        chunk = codec.read_chunk_message(message)
        assert chunk is not None
        assert _fields(chunk) == _protobuf_reads(message)
        assert chunk.message is message  # forwarded as received, no copy
        assert chunk.data.obj is message  # the data is a view into it


def test_read_chunk_message_takes_long_varints_any_field_order_and_repeats():
    data = bytes(range(200)) * 700
    for index, offset, crc in [(0, 0, 0), (1, 1, 1), (300, 2**40 + 5, 0xFFFFFFFF)]:
        message = codec.chunk_message(index, offset, data, crc)
        assert _fields(codec.read_chunk_message(message)) == (index, offset, data, crc)
    empty = codec.read_chunk_message(b"\x12\x00")
    assert _fields(empty) == (0, 0, b"", 0)
    # crc before data, the index given twice (the last wins), as protobuf reads them
    body = b"\x25\x01\x02\x03\x04" + b"\x08\x07" + b"\x1a\x03abc" + b"\x08\x09"
    message = b"\x12" + bytes([len(body)]) + body
    assert _fields(codec.read_chunk_message(message)) == _protobuf_reads(message)
    assert _protobuf_reads(message) == (9, 0, b"abc", 0x04030201)


def test_read_chunk_message_leaves_everything_else_to_protobuf():
    from stalwart.api import paramserver

    header = paramserver.PushRequest(header=paramserver.PushHeader(job_id="j", step=3))
    good = codec.chunk_message(2, 8, b"abcd", 5)
    for message in [
        header.SerializeToString(),
        b"",
        b"\x12",
        good[:-1],  # cut short
        good + b"\x08\x01",  # a field after the chunk
        good + good,  # the chunk in two fields (protobuf merges them)
        b"\x12\x02\x30\x01",  # an unknown field inside the chunk
        b"\x12\x02\x88\x00",  # a tag in two bytes
        b"\x12\x06\x08\x80\x80\x80\x80\x10",  # an index over 32 bits (protobuf truncates)
    ]:
        assert codec.read_chunk_message(message) is None, message
    reader = codec.chunk_reader(paramserver.PushRequest.FromString)
    assert reader(header.SerializeToString()) == header
    assert isinstance(reader(good), codec.WireChunk)
    assert codec.chunk_of(reader(header.SerializeToString())) is None
    assert _fields(codec.chunk_of(paramserver.PushRequest.FromString(good))) == (2, 8, b"abcd", 5)


def test_read_chunk_message_never_reads_what_protobuf_reads_otherwise():
    """Every corruption of a message is either left to protobuf or read exactly as
    protobuf reads it."""
    g = torch.Generator().manual_seed(7)
    base = [
        codec.chunk_message(3, 300, bytes(range(40)), 0xDEADBEEF),
        codec.chunk_message(0, 0, b"xy", 0),
    ]
    read = 0
    for message in base:
        for _ in range(400):
            bad = bytearray(message)
            for pos in torch.randint(0, len(bad), (2,), generator=g).tolist():
                bad[pos] = int(torch.randint(0, 256, (1,), generator=g))
            bad = bytes(bad)
            chunk = codec.read_chunk_message(bad)
            if chunk is not None:
                read += 1
                assert _fields(chunk) == _protobuf_reads(bad), bad
    assert read > 100  # most corruptions hit the data, which still reads


def test_wire_chunks_assemble_bitwise_and_a_flipped_byte_is_data_loss():
    t = sample(torch.float32, (64, 33))
    messages = list(codec.encode_chunk_messages([t], 1000))
    asm = assembler_for(t)
    for m in messages:
        asm.add(codec.read_chunk_message(m))
    assert_bitwise(asm.finish()["t0"], t)
    bad = bytearray(messages[0])
    bad[len(bad) // 2] ^= 0x01
    with raises_kind(ErrorKind.CHECKSUM_MISMATCH):
        assembler_for(t).add(codec.read_chunk_message(bytes(bad)))


def test_crc_of_any_buffer_is_the_crc_of_its_bytes():
    t = sample(torch.float32, (3, 1000))
    want = google_crc32c.value(bytes(codec.byte_view(t)))
    assert codec.crc32c(memoryview(t.numpy())) == want  # 2-d, format "f"
    assert codec.crc32c(bytearray(codec.byte_view(t))) == want
    assert codec.crc32c(memoryview(b"")) == google_crc32c.value(b"") == 0
    assert codec.crc32c(memoryview(b""), 77) == 77


def test_push_answer_parses_as_one_push_response() -> None:
    pulled = paramserver.PullResponse(header=paramserver.PullHeader(version=7, packed=True))
    chunk = codec.chunk_message(1, 64, b"\x01\x02\x03\x04", 0xDEADBEEF)
    wire = codec.push_answer(
        paramserver.PushResponse(version=7, duplicate=True), [pulled.SerializeToString(), chunk]
    )
    answer = paramserver.PushResponse.FromString(wire)
    assert (answer.version, answer.duplicate) == (7, True)
    assert answer.parameters[0] == pulled
    got = answer.parameters[1].chunk
    want = (1, 64, b"\x01\x02\x03\x04", 0xDEADBEEF)
    assert (got.tensor_index, got.offset, got.data, got.crc32c) == want
