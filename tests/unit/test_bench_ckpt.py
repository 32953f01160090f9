"""The checkpoint benchmark's store-only parts run and report what they claim (tiny sizes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stalwart.bench import ckpt as bench
from stalwart.stores import open_store

pytestmark = pytest.mark.timeout(60)


def test_save_restore_and_delta_figures(tmp_path: Path) -> None:
    with open_store(f"file://{tmp_path}") as store:
        figures = bench.save_restore(store, model_mib=2, chunk_bytes=256 * 1024)
        assert figures["bytes"] == 2 * 1024 * 1024 and figures["chunks"] == 8
        assert figures["save_vs_raw_put"] > 0 and figures["restore_vs_raw_get"] > 0
        assert store.list_chunks() == []  # it cleans up after itself

        delta = bench.delta_size(store, 1, [4096], touched=0.01, intervals=2)
        one = delta["chunk_4096"]
        assert one["full_bytes"] == 1024 * 1024
        assert 0 < one["delta_bytes"] < one["full_bytes"]
        assert store.list_chunks() == []
