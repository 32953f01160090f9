"""Small work runs on the event loop's thread, large work in the executor."""

from __future__ import annotations

import asyncio
import threading

import torch

from stalwart.offload import INLINE_BYTES, off_loop, tensor_bytes


def _thread() -> int:
    return threading.get_ident()


def test_small_work_runs_inline_and_large_or_unsized_work_in_the_executor():
    async def main():
        here = threading.get_ident()
        small = await off_loop(_thread, nbytes=INLINE_BYTES - 1)
        large = await off_loop(_thread, nbytes=INLINE_BYTES)
        unsized = await off_loop(_thread)
        return here, small, large, unsized

    here, small, large, unsized = asyncio.run(main())
    assert small == here
    assert large != here and unsized != here


def test_tensor_bytes_counts_every_element():
    tensors = [torch.zeros(3, 4), torch.zeros(5, dtype=torch.float64), torch.zeros(0)]
    assert tensor_bytes(tensors) == 3 * 4 * 4 + 5 * 8
