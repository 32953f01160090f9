"""Row-level deltas: chunks stored as patches against a base chunk, read back bitwise."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from stalwart import checkpoint as ckpt
from stalwart import chunkpatch
from stalwart.api import common
from stalwart.errors import ErrorKind, StalwartError
from stalwart.stores import Store, open_store

pytestmark = pytest.mark.timeout(60)

CHUNK = 64 * 1024
DIM = 64  # float32 row = 256 bytes = one patch block


@pytest.fixture
def store(tmp_path: Path):
    with open_store(f"file://{tmp_path / 'store'}") as s:
        yield s


@pytest.mark.parametrize("size", [4096, 4096 + 100, 37])
def test_patch_round_trip_is_bitwise(size: int) -> None:
    rng = np.random.default_rng(size)
    base = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
    new = bytearray(base)
    for at in (0, min(700, size // 2), size - 1):  # first block, a middle one, the last
        new[at] ^= 0xFF
    blocks = chunkpatch.changed_blocks(base, bytes(new), 256)
    patch = chunkpatch.make_patch(bytes(new), 256, blocks)
    assert len(patch) == chunkpatch.patch_size(size, 256, blocks)
    assert chunkpatch.apply_patch(base, patch) == bytes(new)
    empty = chunkpatch.make_patch(base, 256, chunkpatch.changed_blocks(base, base, 256))
    assert chunkpatch.apply_patch(base, empty) == base


def test_patch_that_does_not_fit_is_data_loss() -> None:
    base = bytes(1024)
    new = bytes([1]) + bytes(1023)
    patch = chunkpatch.make_patch(new, 256, chunkpatch.changed_blocks(base, new, 256))
    for bad_base, bad_patch in [
        (bytes(512), patch),
        (base, patch[:-1]),
        (base, b"XXXX" + patch[4:]),
    ]:
        with pytest.raises(StalwartError) as info:
            chunkpatch.apply_patch(bad_base, bad_patch)
        assert info.value.kind is ErrorKind.DATA_LOSS


def _table(seed: int = 0) -> torch.Tensor:
    return torch.randn(
        2048, DIM, generator=torch.Generator().manual_seed(seed)
    )  # 512 KiB, 8 chunks


def _save(store: Store, table, step: int, base: ckpt.PatchBase, parent=None):
    items = [ckpt.TensorItem("table.weight", table)]
    skip = ckpt.chunk_hashes(parent.tensors) if parent is not None else ()
    refs, stats = ckpt.write_tensors(store, items, chunk_bytes=CHUNK, skip=skip, patch_base=base)
    manifest = ckpt.build_manifest(
        job_id="job", checkpoint_id=ckpt.checkpoint_id_for(step), step=step, tensors=refs,
        shards=[common.ShardState(shard=0, version=step)], store_url=store.url,
        parent_id=parent.checkpoint_id if parent is not None else "",
        written_bytes=stats.written_bytes,
    )  # fmt: skip
    ckpt.publish(store, manifest)
    return manifest, stats


def _touch(table: torch.Tensor, fraction: float, seed: int) -> None:
    rows = torch.randperm(len(table), generator=torch.Generator().manual_seed(seed))
    table[rows[: max(1, int(len(table) * fraction))]] += 1e-3


def test_one_percent_of_rows_is_stored_as_small_patches(store: Store) -> None:
    base = ckpt.PatchBase(block_bytes=DIM * 4)
    table = _table()
    first, full = _save(store, table, 1, base)
    assert full.patched_chunks == 0 and full.written_bytes == full.total_bytes
    _touch(table, 0.01, seed=1)
    second, delta = _save(store, table, 2, base, parent=first)
    assert delta.patched_chunks == delta.written_chunks > 0
    assert full.total_bytes / delta.written_bytes >= 17
    refs = second.tensors[0].chunks
    assert all(
        r.patch_hash and r.base_hash in ckpt.chunk_hashes(first.tensors)
        for r in refs
        if r.patch_hash
    )
    got, _ = ckpt.read_tensors(store, second.tensors)
    assert torch.equal(got["table.weight"], table)  # bitwise
    assert ckpt.verify(store, second).ok
    # the next delta patches the same bases, cumulatively: still readable bitwise
    _touch(table, 0.01, seed=2)
    third, _ = _save(store, table, 3, base, parent=second)
    got, _ = ckpt.read_tensors(store, third.tensors)
    assert torch.equal(got["table.weight"], table)


def test_a_chunk_that_changed_a_lot_is_stored_whole(store: Store) -> None:
    base = ckpt.PatchBase(block_bytes=DIM * 4, max_fraction=0.5)
    table = _table()
    first, _ = _save(store, table, 1, base)
    table += 1.0  # every row: Adam or momentum state moves like this every step
    _, stats = _save(store, table, 2, base, parent=first)
    assert stats.patched_chunks == 0 and stats.written_bytes == stats.total_bytes


def test_corrupt_patch_or_missing_base_is_detected(store: Store) -> None:
    base = ckpt.PatchBase(block_bytes=DIM * 4)
    table = _table()
    first, _ = _save(store, table, 1, base)
    _touch(table, 0.01, seed=3)
    second, _ = _save(store, table, 2, base, parent=first)
    patched = next(r for r in second.tensors[0].chunks if r.patch_hash)
    path = Path(store.root) / "chunks" / patched.patch_hash[:2] / patched.patch_hash
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))
    report = ckpt.verify(store, second)
    assert not report.ok and "patch" in report.problems[0] and "CRC32C" in report.problems[0]
    with pytest.raises(StalwartError) as info:
        ckpt.read_tensors(store, second.tensors)
    assert info.value.kind.code is ErrorKind.DATA_LOSS.code
    choice = ckpt.choose_newest_verified(store, "job")
    assert choice.manifest.checkpoint_id == first.checkpoint_id  # the previous one is used
    store.delete_chunk(patched.base_hash)
    assert "missing" in ckpt.verify(store, second).problems[0]


def test_retention_keeps_bases_that_patches_reference(store: Store, tmp_path: Path) -> None:
    base = ckpt.PatchBase(block_bytes=DIM * 4)
    table = _table()
    first, _ = _save(store, table, 1, base)
    _touch(table, 0.01, seed=4)
    second, _ = _save(store, table, 2, base, parent=first)
    result = ckpt.apply_retention(store, "job", keep=1)
    assert result.deleted_manifests == [first.checkpoint_id]
    got, _ = ckpt.read_tensors(store, second.tensors)
    assert torch.equal(got["table.weight"], table)
    # the durable tier gets the bases and patches, and reads back bitwise too
    with open_store(f"file://{tmp_path / 'durable'}") as durable:
        ckpt.copy_checkpoint(store, durable, second)
        got, _ = ckpt.read_tensors(durable, second.tensors)
        assert torch.equal(got["table.weight"], table)


def test_a_base_collected_meanwhile_is_not_patched_against(store: Store) -> None:
    base = ckpt.PatchBase(block_bytes=DIM * 4)
    table = _table()
    first, _ = _save(store, table, 1, base)
    store.delete_manifest("job", first.checkpoint_id)
    assert ckpt.collect_garbage(store, ["job"]) > 0  # the bases are gone
    _touch(table, 0.01, seed=5)
    second, stats = _save(store, table, 2, base)  # no parent to vouch for the bases
    assert stats.patched_chunks == 0
    got, _ = ckpt.read_tensors(store, second.tensors)
    assert torch.equal(got["table.weight"], table)
