"""Trimming the stored events: the newest ``keep`` stay, older ones go, and the store is
listed once per leader term rather than at every trim (a listing reads every event)."""

from __future__ import annotations

from services.coordinator.statestore import StateStore
from stalwart.api import common
from stalwart.stores import open_store


class CountingLists:
    """A real store that counts its kv_list calls."""

    def __init__(self, store) -> None:
        self.store, self.lists = store, 0

    def kv_list(self, prefix: str = ""):
        self.lists += 1
        return self.store.kv_list(prefix)

    def __getattr__(self, name):
        return getattr(self.store, name)


def _append(state: StateStore, epoch: int, first: int, last: int, keep: int) -> None:
    for sequence in range(first, last + 1):
        event = common.Event(sequence=sequence, message=f"step {sequence} committed")
        state.append_events(epoch, [event], keep)


def _stored(state: StateStore) -> list[int]:
    return [e.sequence for e in state.events()]


def test_events_past_keep_are_deleted_with_one_listing_per_term(tmp_path):
    store = CountingLists(open_store(f"shm://{tmp_path}/state"))
    state = StateStore(store, "t")
    state.take_over(1)
    _append(state, 1, 1, 450, keep=150)
    lists_after_trims = store.lists
    assert _stored(state) == list(range(251, 451))  # trimmed at 400: 250 and below gone
    assert lists_after_trims == 1  # trims at 200, 300, 400: only the first listed

    # The next term (this process or another) may find events some other leader left.
    store.kv_put("t/events/" + f"{5:020d}", common.Event(sequence=5).SerializeToString())
    state.take_over(2)
    before = store.lists
    _append(state, 2, 451, 500, keep=150)
    assert store.lists == before + 1
    assert _stored(state) == list(range(351, 501))
