"""Hypothesis strategies for any protobuf message, built from its descriptor.

Values a hostile or buggy client could send: small and extreme integers, NaN and
infinite floats, empty, unicode and very long strings, enum numbers outside the
enum, nested messages a few levels deep, short repeated fields and maps. Nothing
here knows our API: every field of every request comes from the descriptors the
generated code carries, so a new field is fuzzed without a change here.
"""

from __future__ import annotations

from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import strategies as st

MAX_DEPTH = 3
LONG_STRING = "x" * 100_000  # past every string limit the services set

_T = FieldDescriptor


def _ints(bits: int, signed: bool) -> st.SearchStrategy[int]:
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    edges = st.sampled_from(
        sorted({lo, hi, 0, 1, -1 if signed else 2, 3, 2**31 - 1 if bits > 31 else hi})
    )
    return st.one_of(st.integers(-2 if signed else 0, 8), edges, st.integers(lo, hi))


_SCALARS = {
    _T.TYPE_INT32: _ints(32, True),
    _T.TYPE_SINT32: _ints(32, True),
    _T.TYPE_SFIXED32: _ints(32, True),
    _T.TYPE_INT64: _ints(64, True),
    _T.TYPE_SINT64: _ints(64, True),
    _T.TYPE_SFIXED64: _ints(64, True),
    _T.TYPE_UINT32: _ints(32, False),
    _T.TYPE_FIXED32: _ints(32, False),
    _T.TYPE_UINT64: _ints(64, False),
    _T.TYPE_FIXED64: _ints(64, False),
    _T.TYPE_BOOL: st.booleans(),
    _T.TYPE_FLOAT: st.floats(width=32),
    _T.TYPE_DOUBLE: st.floats(),
    _T.TYPE_STRING: st.one_of(st.text(max_size=24), st.just(""), st.just(LONG_STRING)),
    _T.TYPE_BYTES: st.one_of(st.binary(max_size=64), st.just(b"\x00" * 4096)),
}


def _enum(field: FieldDescriptor) -> st.SearchStrategy[int]:
    numbers = [v.number for v in field.enum_type.values]
    outside = st.sampled_from([min(numbers) - 1, max(numbers) + 1, max(numbers) + 1000])
    return st.one_of(st.sampled_from(numbers), outside)


def _value(field: FieldDescriptor, depth: int) -> st.SearchStrategy:
    if field.type == _T.TYPE_MESSAGE:
        return message(field.message_type, depth + 1)
    if field.type == _T.TYPE_ENUM:
        return _enum(field)
    return _SCALARS[field.type]


def _is_map(field: FieldDescriptor) -> bool:
    return field.type == _T.TYPE_MESSAGE and field.message_type.GetOptions().map_entry


def _field(field: FieldDescriptor, depth: int) -> st.SearchStrategy:
    if _is_map(field):
        key, value = (
            field.message_type.fields_by_name["key"],
            field.message_type.fields_by_name["value"],
        )
        return st.dictionaries(_value(key, depth), _value(value, depth), max_size=3)
    if field.is_repeated:
        return st.lists(_value(field, depth), max_size=3)
    return _value(field, depth)


def message(desc: Descriptor, depth: int = 0) -> st.SearchStrategy:
    """Messages of type ``desc`` with any subset of their fields set."""
    cls = message_factory.GetMessageClass(desc)
    if depth >= MAX_DEPTH:
        return st.just(cls())
    fields = {f.name: _field(f, depth) for f in desc.fields}
    return st.fixed_dictionaries({}, optional=fields).map(lambda values: _build(cls, values))


def _build(cls, values: dict):
    msg = cls()
    for name, value in values.items():
        field = cls.DESCRIPTOR.fields_by_name[name]
        target = getattr(msg, name)
        if _is_map(field):
            for k, v in value.items():
                if field.message_type.fields_by_name["value"].type == _T.TYPE_MESSAGE:
                    target[k].CopyFrom(v)
                else:
                    target[k] = v
        elif field.is_repeated:
            target.extend(value)
        elif field.type == _T.TYPE_MESSAGE:
            target.CopyFrom(value)
        else:
            setattr(msg, name, value)
    return msg
