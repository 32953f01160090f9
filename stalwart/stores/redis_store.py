"""``redis://host:port/db``: a store in Redis, through redis-py.

Keys (all under ``stalwart:``)::

    stalwart:chunk:<sha256>          string, the chunk's bytes
    stalwart:manifests:<job>         hash, checkpoint id -> manifest bytes (HSETNX: one command)
    stalwart:kv:<key>                string
    stalwart:lease:{<name>}          string "<holder>|<token>|<ttl ms>", expires by PX
    stalwart:fence:{<name>}          integer, the last fencing token issued (INCR)

Lease operations are Lua scripts, so check-and-act happens in one atomic step
on the server and expiry uses the server's clock. The ``{name}`` hash tag puts
a lease and its fencing counter in the same slot on a Redis Cluster.

The client never retries by itself: a Lua acquire whose reply was lost would
otherwise run twice and report the lease as taken by someone else. Callers
retry on UNAVAILABLE.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from stalwart.errors import ErrorKind, StalwartError
from stalwart.stores.base import Store
from stalwart.stores.common import (
    Capacity,
    Lease,
    StoreURL,
    check_bytes,
    check_chunk,
    check_hash,
    check_id,
    check_key,
    check_prefix,
    check_ttl,
    not_found,
    store_full,
    unavailable,
    verify_chunk,
)

_NS = "stalwart:"

_ACQUIRE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. token .. '|' .. ARGV[2], 'PX', ARGV[2])
return token
"""

_RENEW = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
"""

_CAS = """
local cur = redis.call('GET', KEYS[1])
if ARGV[1] == '0' then
  if cur then return 0 end
elseif cur ~= ARGV[2] then
  return 0
end
if ARGV[3] == '0' then redis.call('DEL', KEYS[1]) else redis.call('SET', KEYS[1], ARGV[4]) end
return 1
"""


class RedisStore(Store):
    """A store in one Redis database."""

    def __init__(self, parsed: StoreURL) -> None:
        self.url = parsed.redacted
        self.budget_bytes = parsed.budget_bytes
        host, port = parsed.hosts[0]
        self._r = redis.Redis(
            host=host,
            port=port,
            db=parsed.db,
            username=parsed.username,
            password=parsed.password,
            ssl=parsed.scheme == "rediss",
            socket_connect_timeout=parsed.connect_timeout_s,
            socket_timeout=parsed.timeout_s,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
        )
        with self._errors():
            self._r.ping()
        self._acquire = self._r.register_script(_ACQUIRE)
        self._renew = self._r.register_script(_RENEW)
        self._release = self._r.register_script(_RELEASE)
        self._cas = self._r.register_script(_CAS)

    @classmethod
    def from_url(cls, parsed: StoreURL) -> RedisStore:
        return cls(parsed)

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except (redis.ConnectionError, redis.TimeoutError, OSError) as e:
            raise unavailable(self.url, e) from e
        except redis.exceptions.OutOfMemoryError as e:  # at its maxmemory
            raise store_full(self.url, e) from e
        except redis.AuthenticationError as e:
            raise StalwartError(
                ErrorKind.UNAVAILABLE, f"cannot use store {self.url}: {e}", store=self.url
            ) from e
        except redis.RedisError as e:
            raise StalwartError(
                ErrorKind.INTERNAL, f"store {self.url} failed: {e}", store=self.url
            ) from e

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._r.close()

    def capacity(self) -> Capacity | None:
        """Redis's used memory against ``maxmemory`` and the budget (the lower);
        None when neither is set (the server grows until the host runs out)."""
        with self._errors():
            info = self._r.info("memory")
        limits = [b for b in (int(info.get("maxmemory", 0)), self.budget_bytes) if b > 0]
        if not limits:
            return None
        return Capacity(int(info["used_memory"]), min(limits))

    # ------------------------------------------------------------------ chunks

    def put_chunk(self, hash: str, data: bytes | memoryview, *, verified: bool = False) -> None:
        data = check_chunk(hash, data, verified=verified)
        with self._errors():
            self._r.set(_NS + "chunk:" + hash, data)

    def get_chunk(self, hash: str, *, verify: bool = True) -> bytes:
        check_hash(hash)
        with self._errors():
            data = self._r.get(_NS + "chunk:" + hash)
        if data is None:
            raise not_found(f"chunk {hash}", chunk=hash)
        if verify:
            verify_chunk(hash, data)
        return data

    def has_chunk(self, hash: str) -> bool:
        check_hash(hash)
        with self._errors():
            return bool(self._r.exists(_NS + "chunk:" + hash))

    def delete_chunk(self, hash: str) -> bool:
        check_hash(hash)
        with self._errors():
            return bool(self._r.delete(_NS + "chunk:" + hash))

    def list_chunks(self) -> list[str]:
        start = len(_NS + "chunk:")
        with self._errors():
            keys = self._r.scan_iter(match=_NS + "chunk:*", count=1000)
            return sorted(k.decode()[start:] for k in keys)

    # --------------------------------------------------------------- manifests

    def publish_manifest(self, job_id: str, checkpoint_id: str, data: bytes) -> None:
        check_id("job id", job_id)
        check_id("checkpoint id", checkpoint_id)
        data = check_bytes("manifest", data)
        key = _NS + "manifests:" + job_id
        with self._errors():
            if self._r.hsetnx(key, checkpoint_id, data):
                return
            if self._r.hget(key, checkpoint_id) != data:
                raise StalwartError(
                    ErrorKind.ALREADY_EXISTS,
                    f"manifest {job_id}/{checkpoint_id} is already published "
                    "with different content",
                    job=job_id,
                    checkpoint=checkpoint_id,
                )

    def get_manifest(self, job_id: str, checkpoint_id: str) -> bytes:
        check_id("job id", job_id)
        check_id("checkpoint id", checkpoint_id)
        with self._errors():
            data = self._r.hget(_NS + "manifests:" + job_id, checkpoint_id)
        if data is None:
            raise not_found(
                f"manifest {job_id}/{checkpoint_id}", job=job_id, checkpoint=checkpoint_id
            )
        return data

    def list_manifests(self, job_id: str) -> list[str]:
        check_id("job id", job_id)
        with self._errors():
            return sorted(k.decode() for k in self._r.hkeys(_NS + "manifests:" + job_id))

    def list_manifest_jobs(self) -> list[str]:
        prefix = _NS + "manifests:"
        with self._errors():  # a job's hash goes when its last manifest is deleted
            keys = self._r.scan_iter(match=prefix + "*", count=1000)
            return sorted({k.decode()[len(prefix) :] for k in keys})

    def delete_manifest(self, job_id: str, checkpoint_id: str) -> bool:
        check_id("job id", job_id)
        check_id("checkpoint id", checkpoint_id)
        with self._errors():
            return bool(self._r.hdel(_NS + "manifests:" + job_id, checkpoint_id))

    # ---------------------------------------------------------------------- kv

    def kv_get(self, key: str) -> bytes | None:
        check_key("key", key)
        with self._errors():
            return self._r.get(_NS + "kv:" + key)

    def kv_put(self, key: str, value: bytes) -> None:
        check_key("key", key)
        value = check_bytes("value", value)
        with self._errors():
            self._r.set(_NS + "kv:" + key, value)

    def kv_cas(self, key: str, expected: bytes | None, new: bytes | None) -> bool:
        check_key("key", key)
        args = [
            "0" if expected is None else "1",
            b"" if expected is None else check_bytes("expected", expected),
            "0" if new is None else "1",
            b"" if new is None else check_bytes("value", new),
        ]
        with self._errors():
            return bool(self._cas(keys=[_NS + "kv:" + key], args=args))

    def kv_delete(self, key: str) -> bool:
        check_key("key", key)
        with self._errors():
            return bool(self._r.delete(_NS + "kv:" + key))

    def kv_list(self, prefix: str = "") -> dict[str, bytes]:
        # The key alphabet has no glob metacharacters, so the prefix needs no escaping.
        check_prefix(prefix)
        start = len(_NS + "kv:")
        with self._errors():
            keys = sorted(self._r.scan_iter(match=_NS + "kv:" + prefix + "*", count=1000))
            values = self._r.mget(keys) if keys else []
        return {k.decode()[start:]: v for k, v in zip(keys, values, strict=True) if v is not None}

    # ------------------------------------------------------------------ leases

    @staticmethod
    def _lease_keys(name: str) -> list[str]:
        return [f"{_NS}lease:{{{name}}}", f"{_NS}fence:{{{name}}}"]

    @staticmethod
    def _value(lease: Lease) -> str:
        return f"{lease.holder}|{lease.token}|{round(lease.ttl_s * 1000)}"

    def acquire_lease(self, name: str, holder: str, ttl_s: float) -> Lease | None:
        check_key("lease name", name)
        check_key("lease holder", holder)
        ttl_ms = max(1, round(check_ttl(ttl_s) * 1000))
        now = time.time()
        with self._errors():
            token = self._acquire(keys=self._lease_keys(name), args=[holder, ttl_ms])
        if token is None:
            return None
        return Lease(name, holder, int(token), now + ttl_ms / 1000, ttl_ms / 1000)

    def renew_lease(self, lease: Lease) -> bool:
        check_key("lease name", lease.name)
        ttl_ms = max(1, round(lease.ttl_s * 1000))
        with self._errors():
            keys = self._lease_keys(lease.name)[:1]
            return bool(self._renew(keys=keys, args=[self._value(lease), ttl_ms]))

    def release_lease(self, lease: Lease) -> bool:
        check_key("lease name", lease.name)
        with self._errors():
            keys = self._lease_keys(lease.name)[:1]
            return bool(self._release(keys=keys, args=[self._value(lease)]))

    def get_lease(self, name: str) -> Lease | None:
        check_key("lease name", name)
        now = time.time()
        with self._errors():
            pipe = self._r.pipeline(transaction=True)
            key = self._lease_keys(name)[0]
            raw, pttl = pipe.get(key).pttl(key).execute()
        if raw is None or pttl is None or pttl < 0:
            return None
        holder, token, ttl_ms = raw.decode().rsplit("|", 2)
        return Lease(name, holder, int(token), now + pttl / 1000, int(ttl_ms) / 1000)
