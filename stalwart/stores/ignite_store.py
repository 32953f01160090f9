"""``ignite://host:10800[,host2:10800]``: a store in Apache Ignite 2.x, through pyignite.

Four caches, created on first use with the thin client's cache configuration
(so any Ignite 2.x cluster works, nothing to configure server-side). All are
PARTITIONED, ATOMIC, FULL_SYNC (a write returns once every copy has it) with
one backup copy::

    stalwart_chunks      sha256 -> chunk bytes
    stalwart_manifests   "<job>/<checkpoint>" -> manifest bytes (put_if_absent: one atomic op)
    stalwart_kv          key -> value bytes
    stalwart_leases      name -> LeaseRecord JSON {holder, token, expires_at, ttl_s}

Capacity: the thin client cannot read a data region's size or use, so an Ignite
store's limit is the URL's ``budget_mb`` (size it below the data region: see
docs/stores.md) and its use is a byte count kept in ``stalwart_kv`` under
``capacity/chunk_bytes``, raised by every chunk newly stored and lowered by every
chunk deleted (a writer that dies between the two leaves it off by one chunk).

Leases are records changed only with the cache's atomic compare operations
(``put_if_absent``, ``replace_if_equals`` on the whole record), fed by the same
decision functions as the file store. A record is never deleted: releasing
keeps its token, so the next holder's token is always larger. Expiry is judged
by the caller's wall clock against ``expires_at`` (Ignite's thin client has no
server-side clock to ask); keep hosts NTP-synced and lease TTLs well above the
skew, and let the fencing token catch what the clock misses.

The pyignite client is not thread-safe; one lock serialises calls on a store.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from pyignite import Client
from pyignite.datatypes.cache_config import (
    CacheAtomicityMode,
    CacheMode,
    WriteSynchronizationMode,
)
from pyignite.datatypes.prop_codes import (
    PROP_BACKUPS_NUMBER,
    PROP_CACHE_ATOMICITY_MODE,
    PROP_CACHE_MODE,
    PROP_NAME,
    PROP_WRITE_SYNCHRONIZATION_MODE,
)
from pyignite.exceptions import CacheError, HandshakeError, ReconnectError, SocketError

from stalwart.errors import ErrorKind, StalwartError
from stalwart.stores.base import Store
from stalwart.stores.common import (
    Capacity,
    Lease,
    LeaseRecord,
    StoreURL,
    check_bytes,
    check_chunk,
    check_hash,
    check_id,
    check_key,
    check_prefix,
    check_ttl,
    decide_acquire,
    decide_release,
    decide_renew,
    not_found,
    unavailable,
    verify_chunk,
)

# pyignite logs a full traceback at ERROR on every failed (re)connect to a node that
# is down, which a partly degraded cluster turns into a flood. This layer reports a
# node-down condition once, as UNAVAILABLE, when an operation actually fails; an
# application that wants pyignite's own logs sets a level on this logger itself.
_LOG = logging.getLogger(__name__)
_PYIGNITE_LOG = logging.getLogger("pyignite.connection")
if _PYIGNITE_LOG.level == logging.NOTSET:
    _PYIGNITE_LOG.setLevel(logging.CRITICAL)

CACHES = ("chunks", "manifests", "kv", "leases")
USAGE_KEY = "capacity/chunk_bytes"
BACKUPS = 1
_CAS_ATTEMPTS = 16
_NETWORK_ERRORS = (SocketError, ReconnectError, HandshakeError, OSError, EOFError)
T = TypeVar("T")


def cache_name(name: str) -> str:
    return f"stalwart_{name}"


def cache_config(name: str) -> dict:
    """Thin-client settings for one Stalwart cache."""
    return {
        PROP_NAME: cache_name(name),
        PROP_CACHE_MODE: CacheMode.PARTITIONED,
        PROP_BACKUPS_NUMBER: BACKUPS,
        PROP_CACHE_ATOMICITY_MODE: CacheAtomicityMode.ATOMIC,
        PROP_WRITE_SYNCHRONIZATION_MODE: WriteSynchronizationMode.FULL_SYNC,
    }


class IgniteStore(Store):
    """A store in an Ignite cluster reached through its thin-client port(s)."""

    def __init__(self, parsed: StoreURL, *, existing: bool = False) -> None:
        self.url = parsed.redacted
        self.budget_bytes = parsed.budget_bytes
        self._lock = threading.RLock()
        self._probe(parsed)
        kwargs: dict = {"timeout": parsed.timeout_s, "handshake_timeout": parsed.connect_timeout_s}
        if parsed.username:
            kwargs.update(username=parsed.username, password=parsed.password or "")
        self._multi_node = len(parsed.hosts) > 1
        self._client = Client(partition_aware=self._multi_node, **kwargs)
        with self._errors():
            self._client.connect(list(parsed.hosts))
            if existing:
                self._require_caches()
            self._caches = {n: self._client.get_or_create_cache(cache_config(n)) for n in CACHES}

    @classmethod
    def from_url(cls, parsed: StoreURL, *, existing: bool = False) -> IgniteStore:
        return cls(parsed, existing=existing)

    def _require_caches(self) -> None:
        """Refuse, NOT_FOUND, a cluster without this store's caches: opening it makes them."""
        present = set(self._client.get_cache_names())
        missing = [cache_name(n) for n in CACHES if cache_name(n) not in present]
        if missing:
            self._client.close()
            raise StalwartError(
                ErrorKind.NOT_FOUND,
                f"no store at {self.url}: the cluster lacks a store's caches ({', '.join(missing)})",
            )

    def _probe(self, parsed: StoreURL) -> None:
        """Fail fast, with the socket's reason, when no listed node accepts TCP."""
        last: OSError | None = None
        for host, port in parsed.hosts:
            try:
                socket.create_connection((host, port), timeout=parsed.connect_timeout_s).close()
                return
            except OSError as e:
                last = e
        assert last is not None
        raise unavailable(self.url, last) from last

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        with self._lock:
            try:
                yield
            except StalwartError:
                raise
            except _NETWORK_ERRORS as e:
                raise unavailable(self.url, e) from e
            except CacheError as e:
                raise StalwartError(
                    ErrorKind.INTERNAL, f"store {self.url} failed: {e}", store=self.url
                ) from e

    def _idempotent(self, fn: Callable[[], T]) -> T:
        """Run a read or an idempotent write; when it fails on a dead connection and
        the URL lists more than one node, run it once more (pyignite has dropped the
        dead node by then, so the retry goes to a live one)."""
        attempts = 2 if self._multi_node else 1
        for attempt in range(attempts):
            try:
                with self._errors():
                    return fn()
            except StalwartError as e:
                if e.kind is not ErrorKind.UNAVAILABLE or attempt == attempts - 1:
                    raise
        raise AssertionError("not reached")

    def close(self) -> None:
        with self._lock, contextlib.suppress(Exception):
            self._client.close()

    # ------------------------------------------------------------------ chunks

    def put_chunk(self, hash: str, data: bytes | memoryview, *, verified: bool = False) -> None:
        data = check_chunk(hash, data, verified=verified)
        added = self._idempotent(lambda: self._caches["chunks"].put_if_absent(hash, data))
        if added:
            self._count_chunk_bytes(len(data))

    def get_chunk(self, hash: str, *, verify: bool = True) -> bytes:
        check_hash(hash)
        data = self._idempotent(lambda: self._caches["chunks"].get(hash))
        if data is None:
            raise not_found(f"chunk {hash}", chunk=hash)
        data = bytes(data)
        if verify:
            verify_chunk(hash, data)
        return data

    def has_chunk(self, hash: str) -> bool:
        check_hash(hash)
        return bool(self._idempotent(lambda: self._caches["chunks"].contains_key(hash)))

    def delete_chunk(self, hash: str) -> bool:
        check_hash(hash)
        with self._errors():
            old = self._caches["chunks"].get_and_remove(hash)
        if old is None:
            return False
        self._count_chunk_bytes(-len(old))
        return True

    def capacity(self) -> Capacity | None:
        """Counted chunk bytes against ``budget_mb``; None without a budget."""
        if not self.budget_bytes:
            return None
        raw = self.kv_get(USAGE_KEY)
        return Capacity(max(0, int(raw or b"0")), self.budget_bytes)

    def _count_chunk_bytes(self, delta: int) -> None:
        for _ in range(_CAS_ATTEMPTS * 4):
            raw = self.kv_get(USAGE_KEY)
            new = str(max(0, int(raw or b"0") + delta)).encode()
            if self.kv_cas(USAGE_KEY, raw, new):
                return
        _LOG.warning("chunk byte count not updated (%+d): too much contention", delta)

    def _items(self, cache: str, page_size: int = 64) -> list[tuple[str, object]]:
        def scan() -> list[tuple[str, object]]:
            with self._caches[cache].scan(page_size=page_size) as cursor:
                return list(cursor)

        return self._idempotent(scan)

    def _keys(self, cache: str) -> list[str]:
        return [k for k, _ in self._items(cache, page_size=1024)]

    def list_chunks(self) -> list[str]:
        # A scan ships values too; chunk listings are for maintenance, not the hot path.
        return sorted(self._keys("chunks"))

    # --------------------------------------------------------------- manifests

    @staticmethod
    def _manifest_key(job_id: str, checkpoint_id: str) -> str:
        return f"{check_id('job id', job_id)}/{check_id('checkpoint id', checkpoint_id)}"

    def publish_manifest(self, job_id: str, checkpoint_id: str, data: bytes) -> None:
        key = self._manifest_key(job_id, checkpoint_id)
        data = check_bytes("manifest", data)
        cache = self._caches["manifests"]

        def publish() -> bool:
            # Safe to repeat: a retried put_if_absent that had landed finds equal bytes.
            if cache.put_if_absent(key, data):
                return True
            existing = cache.get(key)
            return existing is not None and bytes(existing) == data

        if not self._idempotent(publish):
            raise StalwartError(
                ErrorKind.ALREADY_EXISTS,
                f"manifest {job_id}/{checkpoint_id} is already published with different content",
                job=job_id,
                checkpoint=checkpoint_id,
            )

    def get_manifest(self, job_id: str, checkpoint_id: str) -> bytes:
        key = self._manifest_key(job_id, checkpoint_id)
        data = self._idempotent(lambda: self._caches["manifests"].get(key))
        if data is None:
            raise not_found(
                f"manifest {job_id}/{checkpoint_id}", job=job_id, checkpoint=checkpoint_id
            )
        return bytes(data)

    def list_manifests(self, job_id: str) -> list[str]:
        prefix = check_id("job id", job_id) + "/"
        return sorted(k[len(prefix) :] for k in self._keys("manifests") if k.startswith(prefix))

    def list_manifest_jobs(self) -> list[str]:
        return sorted({k.split("/", 1)[0] for k in self._keys("manifests")})

    def delete_manifest(self, job_id: str, checkpoint_id: str) -> bool:
        key = self._manifest_key(job_id, checkpoint_id)
        with self._errors():
            return self._caches["manifests"].get_and_remove(key) is not None

    # ---------------------------------------------------------------------- kv

    def kv_get(self, key: str) -> bytes | None:
        check_key("key", key)
        value = self._idempotent(lambda: self._caches["kv"].get(key))
        return None if value is None else bytes(value)

    def kv_put(self, key: str, value: bytes) -> None:
        check_key("key", key)
        value = check_bytes("value", value)
        self._idempotent(lambda: self._caches["kv"].put(key, value))

    def kv_cas(self, key: str, expected: bytes | None, new: bytes | None) -> bool:
        check_key("key", key)
        expected = None if expected is None else check_bytes("expected", expected)
        new = None if new is None else check_bytes("value", new)
        with self._errors():
            cache = self._caches["kv"]
            if expected is None and new is None:
                return not cache.contains_key(key)
            if expected is None:
                return bool(cache.put_if_absent(key, new))
            if new is None:
                return bool(cache.remove_if_equals(key, expected))
            return bool(cache.replace_if_equals(key, expected, new))

    def kv_delete(self, key: str) -> bool:
        check_key("key", key)
        with self._errors():
            return self._caches["kv"].get_and_remove(key) is not None

    def kv_list(self, prefix: str = "") -> dict[str, bytes]:
        check_prefix(prefix)
        items = self._items("kv")
        return dict(sorted((k, bytes(v)) for k, v in items if k.startswith(prefix)))

    # ------------------------------------------------------------------ leases

    def _swap_record(self, name: str, raw: str | None, record: LeaseRecord) -> bool:
        cache = self._caches["leases"]
        if raw is None:
            return bool(cache.put_if_absent(name, record.encode()))
        return bool(cache.replace_if_equals(name, raw, record.encode()))

    def acquire_lease(self, name: str, holder: str, ttl_s: float) -> Lease | None:
        check_key("lease name", name)
        check_key("lease holder", holder)
        ttl_s = check_ttl(ttl_s)
        with self._errors():
            for _ in range(_CAS_ATTEMPTS):
                raw = self._caches["leases"].get(name)
                record = decide_acquire(LeaseRecord.decode(raw), holder, ttl_s, time.time())
                if record is None:
                    return None
                if self._swap_record(name, raw, record):
                    return record.as_lease(name)
        return None  # lost every race: someone else is taking it

    def renew_lease(self, lease: Lease) -> bool:
        check_key("lease name", lease.name)
        with self._errors():
            raw = self._caches["leases"].get(lease.name)
            record = decide_renew(LeaseRecord.decode(raw), lease, time.time())
            return record is not None and self._swap_record(lease.name, raw, record)

    def release_lease(self, lease: Lease) -> bool:
        check_key("lease name", lease.name)
        with self._errors():
            raw = self._caches["leases"].get(lease.name)
            record = decide_release(LeaseRecord.decode(raw), lease)
            return record is not None and self._swap_record(lease.name, raw, record)

    def get_lease(self, name: str) -> Lease | None:
        check_key("lease name", name)
        record = LeaseRecord.decode(self._idempotent(lambda: self._caches["leases"].get(name)))
        if record is None or not record.held(time.time()):
            return None
        return record.as_lease(name)
