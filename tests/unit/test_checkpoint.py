"""stalwart.checkpoint and stalwart.retention on real shm:// and file:// stores."""

from __future__ import annotations

import hashlib
import math
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch

from stalwart import checkpoint as ckpt
from stalwart.api import common
from stalwart.errors import ErrorKind, StalwartError
from stalwart.retention import CheckpointInfo, RetentionPolicy, TierPolicy, unreferenced_chunks
from stalwart.stores import Store, open_store

pytestmark = pytest.mark.timeout(60)

CHUNK = 64 * 1024  # small chunks keep the tensors small and the counts readable
ROW = 1024  # float32 elements per row: one row is 4 KiB, 16 rows per chunk


@pytest.fixture(params=["shm", "file"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "shm":
        parent = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        root = tempfile.mkdtemp(prefix="stalwart-ckpt-", dir=parent)
        url = f"shm://{root}"
    else:
        root = None
        url = f"file://{tmp_path / 'store'}"
    with open_store(url) as s:
        yield s
    if root:
        shutil.rmtree(root, ignore_errors=True)


def _model(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "emb.weight": torch.randn(160, ROW, generator=g),  # 640 KiB: exactly 10 chunks
        "fc.bias": torch.randn(7, generator=g, dtype=torch.float64),
        "steps": torch.arange(5, dtype=torch.int64),
        "fc.weight/exp_avg": torch.zeros(16, ROW),  # state of a tensor, 1 chunk
    }


def _items(tensors: dict[str, torch.Tensor]) -> list[ckpt.TensorItem]:
    return ckpt.state_items(tensors, params={"emb.weight", "fc.bias", "steps"})


def _save(store: Store, tensors, step: int, parent: common.CheckpointManifest | None = None):
    skip = ckpt.chunk_hashes(parent.tensors) if parent is not None else ()
    refs, stats = ckpt.write_tensors(store, _items(tensors), chunk_bytes=CHUNK, skip=skip)
    manifest = ckpt.build_manifest(
        job_id="job",
        checkpoint_id=ckpt.checkpoint_id_for(step),
        step=step,
        tensors=refs,
        shards=[common.ShardState(shard=0, version=step)],
        parent_id=parent.checkpoint_id if parent is not None else "",
        store_url=store.url,
        written_bytes=stats.written_bytes,
    )
    ckpt.publish(store, manifest)
    return manifest, stats


def _chunk_path(store: Store, h: str) -> Path:
    return Path(store.root) / "chunks" / h[:2] / h


def _flip_byte(store: Store, h: str, at: int = 100) -> None:
    path = _chunk_path(store, h)
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def test_round_trip_is_bitwise(store: Store) -> None:
    tensors = _model()
    manifest, stats = _save(store, tensors, 1)
    assert stats.total_chunks == stats.written_chunks == 10 + 1 + 1 + 1
    back, read = ckpt.read_tensors(
        store, ckpt.load_manifest(store, "job", manifest.checkpoint_id).tensors
    )
    assert set(back) == set(tensors)
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and torch.equal(back[name], t), name
    assert (
        read.bytes
        == manifest.total_bytes
        == sum(t.numel() * t.element_size() for t in tensors.values())
    )
    kinds = {t.spec.name: t.kind for t in manifest.tensors}
    assert kinds["emb.weight"] == "param" and kinds["fc.weight/exp_avg"] == "exp_avg"
    for t in manifest.tensors:
        for ref in t.chunks:
            assert (
                len(ref.hash) == 64
                and ref.size > 0
                and ref.crc32c == ckpt.crc32c(store.get_chunk(ref.hash))
            )


def test_delta_writes_only_changed_chunks(store: Store) -> None:
    tensors = _model()
    full, stats = _save(store, tensors, 1)
    assert stats.written_chunks == stats.total_chunks == 13
    tensors["emb.weight"][37] += 1.0  # one row inside chunk #2 of the 10-chunk tensor
    delta, stats = _save(store, tensors, 2, parent=full)
    assert (stats.total_chunks, stats.written_chunks) == (13, 1)
    assert stats.written_bytes == CHUNK and stats.total_bytes == full.total_bytes
    assert delta.written_bytes == CHUNK and delta.parent_id == full.checkpoint_id
    changed = [
        i
        for i, (a, b) in enumerate(
            zip(full.tensors[0].chunks, delta.tensors[0].chunks, strict=True)
        )
        if a.hash != b.hash
    ]
    assert changed == [2]
    back, _ = ckpt.read_tensors(store, delta.tensors)
    assert torch.equal(back["emb.weight"], tensors["emb.weight"])
    # without a parent, the store's own contents dedupe: nothing new to write
    again, stats = _save(store, tensors, 3)
    assert stats.written_chunks == 0 and again.written_bytes == 0


def test_manifest_is_invisible_until_published(store: Store) -> None:
    refs, _ = ckpt.write_tensors(store, _items(_model()), chunk_bytes=CHUNK)
    assert store.list_manifests("job") == []
    assert ckpt.choose_newest_verified(store, "job").manifest is None
    manifest = ckpt.build_manifest(job_id="job", checkpoint_id="c1", step=1, tensors=refs)
    ckpt.publish(store, manifest)
    assert store.list_manifests("job") == ["c1"]


def test_publish_refuses_when_a_chunk_is_gone(store: Store) -> None:
    refs, _ = ckpt.write_tensors(store, _items(_model()), chunk_bytes=CHUNK)
    gone = refs[0].chunks[4].hash
    store.delete_chunk(gone)
    manifest = ckpt.build_manifest(job_id="job", checkpoint_id="c1", step=1, tensors=refs)
    with pytest.raises(StalwartError) as err:
        ckpt.publish(store, manifest)
    assert err.value.kind is ErrorKind.DATA_LOSS and gone in err.value.message
    assert store.list_manifests("job") == []


def test_corrupt_chunk_is_data_loss_naming_it(store: Store) -> None:
    manifest, _ = _save(store, _model(), 1)
    bad = manifest.tensors[0].chunks[3].hash
    _flip_byte(store, bad)
    with pytest.raises(StalwartError) as err:
        ckpt.read_tensors(store, manifest.tensors)
    assert err.value.kind.code is grpc.StatusCode.DATA_LOSS
    assert bad in err.value.message and "#3 of tensor emb.weight" in err.value.message
    report = ckpt.verify(store, manifest)
    assert not report.ok and len(report.problems) == 1 and bad in report.problems[0]

    missing = manifest.tensors[1].chunks[0].hash
    store.delete_chunk(missing)
    with pytest.raises(StalwartError) as err:
        ckpt.read_tensors(store, manifest.tensors[1:2])
    assert err.value.kind is ErrorKind.DATA_LOSS and missing in err.value.message


def test_corrupt_newest_is_skipped_for_the_previous(store: Store) -> None:
    tensors = _model()
    first, _ = _save(store, tensors, 1)
    tensors["emb.weight"][0] += 1.0
    second, _ = _save(store, tensors, 2, parent=first)
    changed = second.tensors[0].chunks[0].hash  # only the newest references it
    assert changed not in ckpt.chunk_hashes(first.tensors)
    before = ckpt.CORRUPT_CHECKPOINTS._value.get()
    assert ckpt.choose_newest_verified(store, "job").manifest.checkpoint_id == second.checkpoint_id

    _flip_byte(store, changed)
    choice = ckpt.choose_newest_verified(store, "job")
    assert choice.manifest.checkpoint_id == first.checkpoint_id
    assert [c for c, _ in choice.skipped] == [second.checkpoint_id]
    assert ckpt.CORRUPT_CHECKPOINTS._value.get() == before + 1


def test_unreadable_manifest_is_skipped(store: Store) -> None:
    first, _ = _save(store, _model(), 1)
    store.publish_manifest("job", "step-999999999999", b"\xff\xff not a manifest")
    choice = ckpt.choose_newest_verified(store, "job")
    assert choice.manifest.checkpoint_id == first.checkpoint_id
    assert [c for c, _ in choice.skipped] == ["step-999999999999"]


@pytest.mark.parametrize("bad", ["dtype", "shape"])
def test_a_manifest_with_an_impossible_spec_is_skipped(store: Store, bad: str) -> None:
    first, _ = _save(store, _model(), 1)
    odd = common.CheckpointManifest()
    odd.CopyFrom(first)
    odd.checkpoint_id, odd.step = "step-999999999999", 999999999999
    if bad == "dtype":  # a flipped byte, or a newer build's dtype: still parses
        odd.tensors[0].spec.dtype = 999
    else:  # two negative dimensions multiply to the right size
        spec = odd.tensors[0].spec
        spec.shape[:] = [-1, -math.prod(spec.shape)]
    store.publish_manifest("job", odd.checkpoint_id, odd.SerializeToString())
    choice = ckpt.choose_newest_verified(store, "job")
    assert choice.manifest.checkpoint_id == first.checkpoint_id
    assert [c for c, _ in choice.skipped] == [odd.checkpoint_id]


def test_retention_keeps_newest_and_collects_chunks(store: Store) -> None:
    tensors = _model()
    manifests = []
    parent = None
    for step in range(1, 6):
        tensors["emb.weight"][step * 16] += 1.0  # row 16*step: a different chunk each time
        parent, _ = _save(store, tensors, step, parent=parent)
        manifests.append(parent)
    chunks_before = len(store.list_chunks())
    # the first checkpoint's chunks, then one new chunk per checkpoint after it
    assert chunks_before == len(ckpt.chunk_hashes(manifests[0].tensors)) + 4

    result = ckpt.apply_retention(store, "job", keep=2)
    assert result.kept == [ckpt.checkpoint_id_for(5), ckpt.checkpoint_id_for(4)]
    assert result.deleted_manifests == [ckpt.checkpoint_id_for(s) for s in (3, 2, 1)]
    live = ckpt.chunk_hashes(manifests[3].tensors) | ckpt.chunk_hashes(manifests[4].tensors)
    # checkpoints 1-3 each held one chunk version the survivors do not: 3 garbage chunks
    assert result.deleted_chunks == chunks_before - len(live) == 3
    assert set(store.list_chunks()) == live
    for m in manifests[3:]:
        assert ckpt.verify(store, m).ok


def test_retention_spares_chunks_of_other_jobs(store: Store) -> None:
    first, _ = _save(store, _model(), 1)
    shared = ckpt.chunk_hashes(first.tensors)
    other = ckpt.build_manifest(job_id="other", checkpoint_id="o1", step=1, tensors=first.tensors)
    ckpt.publish(store, other)
    tensors = _model(seed=1)
    _save(store, tensors, 2)
    result = ckpt.apply_retention(store, "job", keep=1, live_jobs=["other"])
    assert result.deleted_manifests == [first.checkpoint_id] and result.deleted_chunks == 0
    assert shared <= set(store.list_chunks())


@pytest.mark.parametrize("how", ["retention", "delete"])
def test_chunks_of_a_job_nobody_named_are_spared(store: Store, how: str) -> None:
    # `ckpt rm --store-url` named no other job, and a cluster sharing the store
    # knows only its own: every job with a manifest in the store counts
    first, _ = _save(store, _model(), 1)
    shared = ckpt.chunk_hashes(first.tensors)
    other = ckpt.build_manifest(job_id="other", checkpoint_id="o1", step=1, tensors=first.tensors)
    ckpt.publish(store, other)
    _save(store, _model(seed=1), 2)
    if how == "retention":
        ckpt.apply_retention(store, "job", keep=1)
    else:
        assert ckpt.delete_checkpoint(store, "job", first.checkpoint_id) == 0
    assert shared <= set(store.list_chunks())
    assert ckpt.verify(store, ckpt.load_manifest(store, "other", "o1")).ok


def test_a_manifest_gone_bad_but_parsing_still_keeps_its_chunks(store: Store) -> None:
    first, _ = _save(store, _model(), 1)
    odd = ckpt.build_manifest(job_id="other", checkpoint_id="o1", step=1, tensors=first.tensors)
    odd.tensors[0].spec.dtype = 999  # unreadable as a checkpoint, its chunks still named
    store.publish_manifest("other", "o1", odd.SerializeToString())
    _save(store, _model(seed=1), 2)
    result = ckpt.apply_retention(store, "job", keep=1)  # not refused for "other"'s sake
    assert result.deleted_manifests == [first.checkpoint_id]
    assert ckpt.chunk_hashes(first.tensors) <= set(store.list_chunks())


def test_collect_garbage_sweeps_an_unpublished_upload(store: Store) -> None:
    kept, _ = _save(store, _model(), 1)
    orphan_refs, _ = ckpt.write_tensors(store, _items(_model(seed=7)), chunk_bytes=CHUNK)
    orphans = ckpt.chunk_hashes(orphan_refs) - ckpt.chunk_hashes(kept.tensors)
    protected = sorted(orphans)[:1]
    assert ckpt.collect_garbage(store, ["job"], protect=protected) == len(orphans) - 1
    assert set(store.list_chunks()) == ckpt.chunk_hashes(kept.tensors) | set(protected)


def test_tiered_copy_to_file_store(store: Store, tmp_path: Path) -> None:
    tensors = _model()
    manifests, parent = [], None
    for step in range(1, 5):
        tensors["fc.bias"] += 1
        parent, _ = _save(store, tensors, step, parent=parent)
        manifests.append(parent)
    policy = TierPolicy(every=2)
    with open_store(f"file://{tmp_path / 'durable'}") as durable:
        copies = [
            ckpt.copy_checkpoint(store, durable, m)
            for i, m in enumerate(manifests, 1)
            if policy.due(i)
        ]
        assert durable.list_manifests("job") == [
            ckpt.checkpoint_id_for(2),
            ckpt.checkpoint_id_for(4),
        ]
        assert copies[0].written_chunks == copies[0].total_chunks == 13
        assert copies[1].written_chunks == 1  # only the bias changed since the last copy
        copy = ckpt.load_manifest(durable, "job", ckpt.checkpoint_id_for(4))
        assert copy.store_url == durable.url
        back, _ = ckpt.read_tensors(durable, copy.tensors)
        assert all(torch.equal(back[n], t) for n, t in tensors.items())


def test_store_pool_opens_each_url_once(tmp_path: Path) -> None:
    opened = []

    def opener(url: str) -> Store:
        opened.append(url)
        return open_store(url)

    pool = ckpt.StorePool(opener)
    url = f"file://{tmp_path}"
    assert pool.get(url) is pool.get(url)
    assert opened == [url]
    pool.close()


def test_bad_chunk_size_is_invalid_argument(store: Store) -> None:
    with pytest.raises(StalwartError) as err:
        ckpt.write_tensors(store, _items(_model()), chunk_bytes=100)
    assert err.value.kind is ErrorKind.INVALID_ARGUMENT


# --- decisions, no I/O ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("keep", "pinned", "kept", "deleted"),
    [
        (2, (), ("c", "b"), ("a",)),
        (1, ("a",), ("c", "a"), ("b",)),
        (5, (), ("c", "b", "a"), ()),
    ],
)
def test_retention_policy(keep, pinned, kept, deleted) -> None:
    infos = [CheckpointInfo("b", 20), CheckpointInfo("a", 10), CheckpointInfo("c", 30)]
    decision = RetentionPolicy(keep).decide(infos, pinned)
    assert (decision.keep, decision.delete) == (kept, deleted)


def test_retention_orders_by_step_then_time() -> None:
    infos = [CheckpointInfo("x", 5, 2), CheckpointInfo("y", 5, 1), CheckpointInfo("z", 4, 9)]
    assert RetentionPolicy(1).decide(infos).keep == ("x",)


def test_unreferenced_chunks_and_tiering() -> None:
    assert unreferenced_chunks(["a", "b", "c", "d"], {"m1": {"a"}, "m2": {"b"}}, protect={"d"}) == [
        "c"
    ]
    assert [i for i in range(1, 10) if TierPolicy(3).due(i)] == [3, 6, 9]
    assert not any(TierPolicy(0).due(i) for i in range(5))
    with pytest.raises(ValueError):
        RetentionPolicy(0)


def test_identical_chunks_in_one_write_are_stored_once(store: Store) -> None:
    zeros = {"a/exp_avg": torch.zeros(32, ROW), "a/exp_avg_sq": torch.zeros(32, ROW)}
    refs, stats = ckpt.write_tensors(store, ckpt.state_items(zeros, ()), chunk_bytes=CHUNK)
    assert (stats.total_chunks, stats.written_chunks) == (4, 1)
    back, _ = ckpt.read_tensors(store, refs)
    assert all(torch.equal(back[n], t) for n, t in zeros.items())


def test_each_chunk_is_hashed_once_per_write_and_per_read(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer's content address is the store's check (put_chunk(verified=True));
    a read checks each chunk once, and so does a copy to another store."""
    hashed: list[int] = []
    real = hashlib.sha256

    def counting(data=b"", **kwargs):
        hashed.append(len(data))
        return real(data, **kwargs)

    monkeypatch.setattr(hashlib, "sha256", counting)
    tensors = _model()
    manifest, stats = _save(store, tensors, 1)
    assert len(hashed) == stats.total_chunks == 13
    hashed.clear()
    back, _ = ckpt.read_tensors(store, manifest.tensors)
    assert len(hashed) == 13 and all(torch.equal(back[n], t) for n, t in tensors.items())
    hashed.clear()
    with open_store(f"file://{tmp_path / 'durable'}") as durable:
        ckpt.copy_checkpoint(store, durable, manifest)
        assert len(hashed) == 13
        hashed.clear()
        assert ckpt.verify(durable, manifest).ok and len(hashed) == 13


def test_copy_refuses_a_corrupt_chunk(store: Store, tmp_path: Path) -> None:
    manifest, _ = _save(store, _model(), 1)
    bad = manifest.tensors[0].chunks[2].hash
    _flip_byte(store, bad)
    with open_store(f"file://{tmp_path / 'durable'}") as durable:
        with pytest.raises(StalwartError) as err:
            ckpt.copy_checkpoint(store, durable, manifest, workers=1)
        assert err.value.kind.code is grpc.StatusCode.DATA_LOSS and bad in err.value.message
        assert not durable.has_chunk(bad) and durable.list_manifests("job") == []


class _PublishWaits:
    """The store, but a manifest's publish waits (up to ``wait_s``) for ``done`` after
    its chunks were checked: the window another job's retention could fall in."""

    def __init__(self, store: Store, checked: threading.Event, done: threading.Event):
        self._store, self._checked, self._done = store, checked, done

    def __getattr__(self, name):
        return getattr(self._store, name)

    def publish_manifest(self, job_id: str, checkpoint_id: str, data: bytes) -> None:
        self._checked.set()
        self._done.wait(timeout=1.0)  # never set while retention must wait for us
        self._store.publish_manifest(job_id, checkpoint_id, data)


def test_another_jobs_retention_waits_for_a_publish_that_reuses_its_chunks(store: Store):
    shared, _ = _save(store, _model(0), 1)  # job "job": its chunks, soon old
    _save(store, _model(1), 2)  # its newer checkpoint shares none of them
    reuse = common.CheckpointManifest()
    reuse.CopyFrom(shared)
    reuse.job_id = "other"  # an upload of job "other" found every chunk stored already
    checked, done = threading.Event(), threading.Event()

    def retention() -> None:
        checked.wait(timeout=30)
        ckpt.apply_retention(store, "job", 1, live_jobs=["other"])
        done.set()

    beside = threading.Thread(target=retention)
    beside.start()
    ckpt.publish(_PublishWaits(store, checked, done), reuse)
    beside.join(timeout=30)
    assert done.is_set()
    assert [m.step for m in ckpt.list_checkpoints(store, "job")[0]] == [2]  # retention ran
    report = ckpt.verify(store, ckpt.load_manifest(store, "other", reuse.checkpoint_id))
    assert report.ok, report.problems  # before: published with every chunk deleted
