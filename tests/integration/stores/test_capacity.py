"""Stores with a budget: each backend filled past it refuses the next checkpoint with
RESOURCE_EXHAUSTED before writing a byte, keeps the last complete one valid, and makes
room by retention when retention can."""

from __future__ import annotations

import pytest
import torch

from stalwart import checkpoint as ckpt
from stalwart.errors import ErrorKind, StalwartError
from stalwart.stores import open_store

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

MIB = 1 << 20
# Each checkpoint: one fresh 8 MiB tensor, margins of half that. Redis's used memory
# moves by a MiB or two on its own (client buffers, allocator classes).
STATE_MIB = 8
MARGIN_MIB = STATE_MIB // 2


def _with_budget(url: str, mib: int) -> str:
    """``url`` with its budget (the test backends' Ignite URL has one) set to ``mib``."""
    base, _, query = url.partition("?")
    options = [o for o in query.split("&") if o and not o.startswith("budget_mb=")]
    return f"{base}?{'&'.join([*options, f'budget_mb={mib}'])}"


def _used(url: str) -> int:
    with open_store(_with_budget(url, 1 << 20)) as store:
        cap = store.capacity()
    assert cap is not None and cap.limit_bytes > 0
    return cap.used_bytes


def _state(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(STATE_MIB * MIB // 4, generator=gen)}


def _save(store, job: str, step: int) -> dict[str, torch.Tensor]:
    state = _state(step)
    ckpt.make_room(store, job, STATE_MIB * MIB)
    refs, _ = ckpt.write_tensors(store, ckpt.state_items(state, state), chunk_bytes=MIB)
    ckpt.publish(store, ckpt.build_manifest(job_id=job, checkpoint_id=f"c{step}", step=step,
                                            tensors=refs, store_url=store.url))  # fmt: skip
    return state


def _read(store, job: str, step: int) -> dict[str, torch.Tensor]:
    back, _ = ckpt.read_tensors(store, ckpt.load_manifest(store, job, f"c{step}").tensors)
    return back


@pytest.mark.parametrize("backend", ["shm", "file", "redis", "ignite"])
def test_a_full_store_refuses_the_checkpoint_and_keeps_the_last_one(request, backend, uniq):
    url = request.getfixturevalue(f"{backend}_url")
    before = _used(url)
    with open_store(_with_budget(url, 1 << 20)) as store:
        first = _save(store, uniq, 1)
    cost = _used(url) - before  # what one checkpoint takes here (Redis: more than its bytes)
    assert cost >= STATE_MIB * MIB
    # room for one checkpoint and a margin: the second cannot fit beside the first
    with open_store(_with_budget(url, (before + cost) // MIB + MARGIN_MIB)) as store:
        chunks_before = set(store.list_chunks())
        with pytest.raises(StalwartError) as refused:
            _save(store, uniq, 2)
        assert refused.value.kind is ErrorKind.STORE_FULL
        assert "not written" in refused.value.message and uniq in refused.value.message
        assert set(store.list_chunks()) == chunks_before  # not a byte of it was stored
        assert torch.equal(_read(store, uniq, 1)["w"], first["w"])  # the last one is whole
        assert ckpt.verify(store, ckpt.load_manifest(store, uniq, "c1")).ok
        store.kv_put(f"{uniq}/alive", b"1")  # the store itself still works
        assert store.kv_get(f"{uniq}/alive") == b"1"
    # room for two and a margin: the third is written after retention removed the oldest
    with open_store(_with_budget(url, (before + 2 * cost) // MIB + MARGIN_MIB)) as store:
        second = _save(store, uniq, 2)
        third = _save(store, uniq, 3)
        assert store.list_manifests(uniq) == ["c2", "c3"]
        assert torch.equal(_read(store, uniq, 2)["w"], second["w"])
        assert torch.equal(_read(store, uniq, 3)["w"], third["w"])
        for step in (2, 3):
            ckpt.delete_checkpoint(store, uniq, f"c{step}")


def test_budget_option_is_checked():
    with pytest.raises(StalwartError) as bad:
        open_store("shm:///dev/shm/x?budget_mb=lots")
    assert bad.value.kind is ErrorKind.INVALID_ARGUMENT and "budget_mb" in bad.value.message
