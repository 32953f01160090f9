"""The leader sweeps the checkpoint store of chunks no manifest names (uploads that
never published), only while nothing of its own is being saved, restored or deleted.
Before, nothing ever swept them and a store with a budget filled up for good."""

from __future__ import annotations

import asyncio
import time

import torch

from services.coordinator.checkpoints import Checkpoints
from services.coordinator.settings import CoordinatorSettings
from stalwart import checkpoint as ckpt
from stalwart.api import common
from tests.unit.coordinator.leaders import elected


def _written(store, seed: int) -> list[common.CheckpointTensor]:
    tensors = {"w": torch.randn(64, 64, generator=torch.Generator().manual_seed(seed))}
    refs, _ = ckpt.write_tensors(store, ckpt.state_items(tensors, params={"w"}), chunk_bytes=4096)
    return refs


def test_unpublished_chunks_are_swept_when_no_save_is_under_way(tmp_path) -> None:
    url = f"shm://{tmp_path}/state"
    control = elected(url, 1)
    settings = CoordinatorSettings(store_url=url, checkpoint_url=f"shm://{tmp_path}/ckpt",
                                   checkpoint_gc_seconds=60.0)  # fmt: skip
    checkpoints = Checkpoints(control, lambda address: None, lambda shard: [], settings)
    store = checkpoints.store()
    kept = ckpt.build_manifest(job_id="a", checkpoint_id="c1", step=1, tensors=_written(store, 0))
    ckpt.publish(store, kept)
    orphans = ckpt.chunk_hashes(_written(store, 1))  # an upload that never published
    assert orphans <= set(store.list_chunks())

    now = time.monotonic()
    assert not checkpoints._sweep_due(now)  # a new leader waits one interval
    checkpoints._swept_at = now - 61.0

    async def while_saving() -> bool:
        async with checkpoints._job_lock("a"):
            return checkpoints._sweep_due(time.monotonic())

    assert not asyncio.run(while_saving())  # its chunks may not be published yet
    assert checkpoints._sweep_due(time.monotonic())
    assert asyncio.run(checkpoints._sweep()) == len(orphans)
    assert set(store.list_chunks()) == ckpt.chunk_hashes(kept.tensors)
    assert ckpt.verify(store, kept).ok
    assert not checkpoints._sweep_due(time.monotonic())  # not again until the interval
