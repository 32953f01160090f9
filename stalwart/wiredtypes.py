"""Byte sizes of the wire dtypes, without torch.

The coordinator checks checkpoint manifests (chunk sizes against tensor shapes)
and carries no torch in its image; stalwart.codec maps the same dtypes to torch
dtypes for the processes that hold tensors. tests/unit/test_codec.py keeps the
two tables in step.
"""

from __future__ import annotations

import math

from stalwart.api import common
from stalwart.errors import ErrorKind, StalwartError

ITEMSIZE: dict[int, int] = {
    common.DTYPE_FLOAT32: 4,
    common.DTYPE_FLOAT64: 8,
    common.DTYPE_FLOAT16: 2,
    common.DTYPE_BFLOAT16: 2,
    common.DTYPE_INT64: 8,
    common.DTYPE_INT32: 4,
    common.DTYPE_INT16: 2,
    common.DTYPE_INT8: 1,
    common.DTYPE_UINT8: 1,
    common.DTYPE_BOOL: 1,
}


def element_size(wire_dtype: int) -> int:
    try:
        return ITEMSIZE[wire_dtype]
    except KeyError:
        raise StalwartError(ErrorKind.BAD_DTYPE, f"unknown dtype {wire_dtype}") from None


def tensor_nbytes(spec: common.TensorSpec) -> int:
    return math.prod(spec.shape) * element_size(spec.dtype)
