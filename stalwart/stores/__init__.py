"""Stores, chosen by URL: checkpoints (chunks + manifests), cluster state, leases.

    from stalwart.stores import open_store
    with open_store("shm:///dev/shm/stalwart") as store:
        h = chunk_hash(data)
        store.put_chunk(h, data)
        store.publish_manifest("job-1", "step-100", manifest_bytes)

URLs (see docs/stores.md):

* ``shm:///dev/shm/stalwart``       files in shared memory; flock leases (one host)
* ``file:///var/lib/stalwart``      the same, fsync'd (durable tier)
* ``redis://host:6379/0``           Redis (``rediss://`` for TLS)
* ``ignite://host:10800[,host2:10800]``  Apache Ignite 2.x thin client

Networked URLs take ``?connect_timeout=S&timeout=S`` (defaults 3 and 30 seconds).
"""

from __future__ import annotations

from stalwart.stores.base import Store
from stalwart.stores.common import (
    Lease,
    StoreURL,
    chunk_hash,
    crc32c,
    parse_store_url,
    verify_chunk,
)

__all__ = [
    "Lease",
    "Store",
    "StoreURL",
    "chunk_hash",
    "crc32c",
    "open_store",
    "parse_store_url",
    "verify_chunk",
]


def open_store(url: str, *, existing: bool = False) -> Store:
    """Open the store a URL names.

    Opening makes what a new store needs (a directory store's folders, an Ignite
    cluster's caches); with ``existing=True`` a store that is not there yet is refused
    instead, so a command that only reads leaves nothing behind.

    Raises StalwartError: INVALID_ARGUMENT for a malformed URL, UNAVAILABLE
    (naming the URL and the reason) when the backend cannot be reached, NOT_FOUND
    with ``existing=True`` when it holds no store.
    Backends are imported on demand, so ``shm://`` needs neither redis nor pyignite.
    """
    parsed = parse_store_url(url)
    if parsed.scheme in ("shm", "file"):
        from stalwart.stores.fs_store import FileStore

        return FileStore.from_url(parsed, existing=existing)
    if parsed.scheme in ("redis", "rediss"):
        from stalwart.stores.redis_store import RedisStore

        return RedisStore.from_url(parsed)  # reading creates nothing in redis
    from stalwart.stores.ignite_store import IgniteStore

    return IgniteStore.from_url(parsed, existing=existing)
