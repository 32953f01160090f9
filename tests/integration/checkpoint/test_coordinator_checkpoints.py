"""The coordinator orders checkpoints during a real job and restores one when every
paramserver replica is lost: on shm, Redis and Ignite, with real trainers.

One job per backend: checkpoints every 2 steps, the paramserver pair killed -9
mid-job, fresh replicas started for the group, the job restored from the newest
verified checkpoint, and the final weights bitwise equal to the fault-free
reference run. A second test flips a byte in the newest checkpoint so the
restore falls back to the previous one.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from stalwart import checkpoint as ckpt
from stalwart import training
from stalwart.api import common, coordinator
from stalwart.client import CoordinatorClient
from stalwart.stores import open_store
from tests.backends import shm_url  # noqa: F401
from tests.helpers import assert_eventually_async
from tests.integration.coordinator.support import wait_leader
from tests.integration.trainer.conftest import Procs
from tests.integration.trainer.support import assert_bitwise_equal, final_weights, small_spec

pytestmark = pytest.mark.timeout(240)

STEPS = 12


@pytest.fixture
def procs(run_dir: Path, store_url: str):
    p = Procs(run_dir / "ckpt-orch", store_url)
    try:
        yield p
    finally:
        p.stop_all()


async def _wait_job(client: CoordinatorClient, job_id: str, timeout: float) -> coordinator.Job:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = await client.get_job(job_id)
        if job.state in (coordinator.JOB_STATE_SUCCEEDED, coordinator.JOB_STATE_FAILED):
            return job
        await asyncio.sleep(0.2)
    raise AssertionError(f"job {job_id} not finished after {timeout}s: {job}")


def _pair(procs: Procs, join: tuple[str, ...], tag: str):
    backup = procs.start("services.paramserver", f"ps-{tag}-b", "--role", "backup", *join)
    primary = procs.start("services.paramserver", f"ps-{tag}-p", "--role", "primary",
                          "--backups", backup.address, *join)  # fmt: skip
    return primary, backup


async def _run_with_total_loss(procs: Procs, tmp_path: Path, corrupt_newest: bool) -> dict:
    # trainers sleep a little per step so the checkpoints and the kill land mid-job
    spec = small_spec(steps=STEPS, checkpoint_interval=2)
    training.make_deterministic()
    want = await asyncio.to_thread(training.reference_run, spec)
    durable = f"file://{tmp_path / 'durable'}"
    coord = procs.coordinator("c1", "--keep-checkpoints", "3", "--durable-url", durable,
                              "--durable-every", "2")  # fmt: skip
    await wait_leader(coord.address)
    join = ("--coordinator", coord.address)
    old = _pair(procs, join, "old")
    for slot in range(2):
        procs.trainer(f"tr{slot}", *join, "--retry-seconds", "10", faults="delay_s=0.1")
    job_id = f"ckpt-{procs.prefix}"
    async with CoordinatorClient(coord.address) as client:
        await client.create_job(spec, job_id=job_id)

        async def two_checkpoints():
            listed = (await client.list_checkpoints(job_id)).checkpoints
            assert len(listed) >= 2 and listed[0].step >= 4, [c.step for c in listed]
            return listed

        listed = await assert_eventually_async(two_checkpoints, timeout=120, interval=0.2)
        for proc in old:
            proc.kill()
        killed_at = (await client.get_job(job_id)).step
        newest = (await client.list_checkpoints(job_id)).checkpoints[0]
        assert (await client.verify_checkpoint(newest.checkpoint_id)).ok
        if corrupt_newest:
            _flip_a_chunk_byte(procs.store_url, newest)
        # fresh, empty replicas for the same shard, started at once: they must
        # not be promoted empty, the group is restored from a checkpoint instead
        fresh = await asyncio.to_thread(_pair, procs, join, "new")

        async def group_lost():
            events = await _events(client, job_id)
            assert any("lost" in e.message for e in events), [e.message for e in events]

        await assert_eventually_async(group_lost, timeout=30, interval=0.2)
        assert (await client.get_job(job_id)).state != coordinator.JOB_STATE_FAILED
        done = await _wait_job(client, job_id, 150)
        assert done.state == coordinator.JOB_STATE_SUCCEEDED, done.reason
        events = await _events(client, job_id)
        remaining = (await client.list_checkpoints(job_id)).checkpoints
    version, got = await final_weights([a.address for a in fresh], job_id, spec)
    assert version == STEPS
    assert_bitwise_equal(got, want)
    restored = [e for e in events if e.kind == common.EVENT_KIND_CHECKPOINT_RESTORED]
    saved = [e for e in events if e.kind == common.EVENT_KIND_CHECKPOINT_SAVED]
    assert len(restored) == 1 and len(saved) >= 3
    assert len(remaining) <= 3  # retention keeps the newest 3
    with open_store(durable) as tier:
        assert tier.list_manifests(job_id)  # every 2nd checkpoint went to the durable tier
    return {"listed": listed, "newest": newest, "restored": restored[0], "killed_at": killed_at,
            "events": events}  # fmt: skip


async def _events(client: CoordinatorClient, job_id: str) -> list[common.Event]:
    out = []

    async def collect():
        async for event in client.watch_events(job_id=job_id):
            out.append(event)

    task = asyncio.create_task(collect())
    await asyncio.sleep(0.5)  # the replay of stored events arrives at once
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return out


def _flip_a_chunk_byte(url: str, manifest: common.CheckpointManifest) -> None:
    """Corrupt a chunk only the newest checkpoint stores (a patch, or a whole chunk)."""
    with open_store(url) as store:
        older = set()
        for m in ckpt.list_checkpoints(store, manifest.job_id)[0]:
            if m.checkpoint_id != manifest.checkpoint_id:
                older |= ckpt.chunk_hashes(m.tensors)
        key = sorted(ckpt.chunk_hashes(manifest.tensors) - older)[0]
        path = Path(store.root) / "chunks" / key[:2] / key  # shm: chunks are files
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
        assert not ckpt.verify(store, manifest).ok


async def test_checkpoints_every_n_steps_and_restore_after_total_loss_bitwise(procs, tmp_path):
    result = await _run_with_total_loss(procs, tmp_path, corrupt_newest=False)
    listed = result["listed"]
    for c in listed:  # every shard snapshotted the checkpoint's step
        assert [s.version for s in c.shards] == [c.step] * len(c.shards), c
    steps = sorted(c.step for c in listed)
    # every 2 steps: at each even step, or at once when the job outran a save (a
    # catch-up covering the even step it passed); never twice before the next mark
    assert all(b >= (a // 2 + 1) * 2 for a, b in zip(steps, steps[1:], strict=False)), steps
    restored = result["restored"]
    assert restored.attributes["checkpoint"] == result["newest"].checkpoint_id


@pytest.fixture
def shm_procs(run_dir: Path, shm_url: str):  # noqa: F811
    p = Procs(run_dir / "ckpt-orch", shm_url)
    try:
        yield p
    finally:
        p.stop_all()


async def test_corrupt_newest_checkpoint_restores_the_previous(shm_procs, tmp_path):
    # the fallback is backend-independent (verify reads through the Store interface): shm only
    result = await _run_with_total_loss(shm_procs, tmp_path, corrupt_newest=True)
    restored = result["restored"]
    assert restored.attributes["checkpoint"] != result["newest"].checkpoint_id
    assert restored.step < result["newest"].step
    corrupt = [e for e in result["events"] if e.kind == common.EVENT_KIND_CORRUPTION_DETECTED]
    assert corrupt and corrupt[0].attributes["checkpoint"] == result["newest"].checkpoint_id
