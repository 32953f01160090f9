"""A file store's capacity walk while other writers change the chunk directories."""

from __future__ import annotations

import os

from stalwart.stores import chunk_hash, open_store


def test_capacity_skips_a_chunk_deleted_while_it_is_counted(tmp_path, monkeypatch) -> None:
    """Retention (or another save's temp file being renamed) can remove a file between
    the directory listing and its stat; a save asking how full the store is used to
    fail with INTERNAL (FileNotFoundError) then."""
    store = open_store(f"shm://{tmp_path}")
    chunks = [os.urandom(1000 + i) for i in range(3)]
    for data in chunks:
        store.put_chunk(chunk_hash(data), data)
    listed_scandir = os.scandir
    gone = chunk_hash(chunks[0])

    def scandir_then_delete(path):
        entries = list(listed_scandir(path))
        if any(e.name == gone for e in entries):
            store.delete_chunk(gone)  # listed, then deleted before its stat
        return iter(entries)

    monkeypatch.setattr(os, "scandir", scandir_then_delete)
    used = store.capacity().used_bytes
    monkeypatch.undo()
    assert used == len(chunks[1]) + len(chunks[2])
    assert store.capacity().used_bytes == used
    store.close()
