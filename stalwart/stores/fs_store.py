"""``shm://`` and ``file://``: a store that is a directory.

One class serves both; ``durable`` decides whether data is fsync'd:

* ``shm:///dev/shm/stalwart`` - tmpfs, nothing to install, one host. Chunks are
  not fsync'd (there is no disk); manifests still go through write + fsync +
  rename so the publish protocol is the same everywhere.
* ``file:///path`` - disk or a mounted volume: every file and the directory
  entries that name it are fsync'd before a call returns.

Layout under the root::

    chunks/<first 2 hex>/<sha256>      content-addressed chunk files
    manifests/<job>/<checkpoint>.mf    published manifests (hard-linked in, never overwritten)
    kv/k.<key with / as ~>             values; kv/.lock serialises writers
    leases/<name with / as ~>/lock     short mutex for lease state changes
    leases/<...>/state                 LeaseRecord JSON; never deleted, so it is the fencing counter
    leases/<...>/<token>.held          flock'd by the holder for as long as it holds the lease

Temporary files start with ``.tmp-`` and live next to their final name, so a
rename never crosses file systems; listings skip them. A writer killed at any
point leaves at most a ``.tmp-`` file behind, never a partial visible object.

Leases combine a TTL with an OS file lock: the holder keeps an open,
``flock``'d file named after its token. The kernel drops that lock when the
holder process dies, however it dies, so the next acquirer sees the lease free
at once instead of waiting for the TTL. A holder that is alive but stops
renewing loses the lease when the TTL runs out.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
import time
import uuid
from collections.abc import Iterator

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
    store_full,
    unavailable,
    verify_chunk,
)

_TMP = ".tmp-"
#: The folders a store's root holds; FileStore makes them when it opens one.
SUBFOLDERS = ("chunks", "manifests", "kv", "leases")


def holds_store(root: str) -> bool:
    """Whether ``root`` is a store's folder (opening any other folder makes it one)."""
    return all(os.path.isdir(os.path.join(root, sub)) for sub in SUBFOLDERS)


def _require_store(url: str, root: str) -> None:
    """Refuse, NOT_FOUND, a root that is not a store's folder: opening it would make it one
    (a mistyped path would put a store's folders into a user's own folder)."""
    if not os.path.isdir(root):
        raise StalwartError(ErrorKind.NOT_FOUND, f"no store at {url}: {root} is not a folder")
    if not holds_store(root):
        folders = ", ".join(f"{sub}/" for sub in SUBFOLDERS)
        raise StalwartError(
            ErrorKind.NOT_FOUND, f"no store at {url}: {root} lacks a store's folders ({folders})"
        )


class FileStore(Store):
    """A store in a local directory; ``durable=True`` fsyncs everything."""

    def __init__(
        self, root: str, *, durable: bool, url: str | None = None, budget_bytes: int = 0
    ) -> None:
        self.root = root
        self.budget_bytes = budget_bytes
        self.durable = durable
        self.url = url or f"{'file' if durable else 'shm'}://{root}"
        self._held: dict[tuple[str, int], int] = {}  # (lease name, token) -> fd holding the flock
        self._held_lock = threading.Lock()
        try:
            for sub in SUBFOLDERS:
                os.makedirs(os.path.join(root, sub), exist_ok=True)
            probe = os.path.join(root, "kv", ".lock")
            os.close(os.open(probe, os.O_RDWR | os.O_CREAT, 0o644))
        except OSError as e:
            raise StalwartError(
                ErrorKind.UNAVAILABLE,
                f"cannot reach store {self.url}: {(e.strerror or str(e)).lower()}",
                store=self.url,
            ) from e

    @classmethod
    def from_url(cls, parsed: StoreURL, *, existing: bool = False) -> FileStore:
        if existing:
            _require_store(parsed.redacted, parsed.path)
        return cls(parsed.path, durable=parsed.scheme == "file", url=parsed.redacted,
                   budget_bytes=parsed.budget_bytes)  # fmt: skip

    def capacity(self) -> Capacity:
        """Bytes of stored chunks; the limit: the budget, and the room left on the
        file system (tmpfs for shm://) on top of what the chunks already use."""
        base = os.path.join(self.root, "chunks")
        used = sum(_bytes_of_files(fan.path) for fan in os.scandir(base) if fan.is_dir())
        fs = os.statvfs(self.root)
        limit = used + fs.f_bavail * fs.f_frsize
        if self.budget_bytes:
            limit = min(limit, self.budget_bytes)
        return Capacity(used, limit)

    # ------------------------------------------------------------ file helpers

    def _fsync_dir(self, path: str) -> None:
        if not self.durable:
            return
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _write_tmp(self, directory: str, data: bytes, *, sync: bool) -> str:
        """Write ``data`` to a fresh temp file in ``directory``; return its path."""
        tmp = os.path.join(directory, f"{_TMP}{uuid.uuid4().hex}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError as exc:
            raise self._write_error(exc) from exc
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            if sync:
                os.fsync(fd)
        except BaseException as exc:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if isinstance(exc, OSError):
                raise self._write_error(exc) from exc
            raise
        os.close(fd)
        return tmp

    def _write_error(self, exc: OSError) -> StalwartError:
        """A write the file system refused: STORE_FULL when it is out of room (the
        default ``shm://`` is a tmpfs, 64 MiB in a container), UNAVAILABLE otherwise;
        a raw OSError answered INTERNAL and escaped the coordinator's handlers."""
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return store_full(self.url, exc)
        return unavailable(self.url, exc)

    def _replace(self, directory: str, final: str, data: bytes) -> None:
        """Atomically make ``final`` hold ``data`` (tmp + fsync + rename)."""
        tmp = self._write_tmp(directory, data, sync=self.durable)
        try:
            os.replace(tmp, final)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self._fsync_dir(directory)

    @staticmethod
    def _read(path: str) -> bytes | None:
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    @staticmethod
    @contextlib.contextmanager
    def _flocked(path: str) -> Iterator[None]:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the only fd drops the flock

    # ------------------------------------------------------------------ chunks

    def _chunk_path(self, hash: str) -> tuple[str, str]:
        directory = os.path.join(self.root, "chunks", hash[:2])
        return directory, os.path.join(directory, hash)

    def put_chunk(self, hash: str, data: bytes | memoryview, *, verified: bool = False) -> None:
        data = check_chunk(hash, data, verified=verified, views=True)
        directory, final = self._chunk_path(hash)
        if os.path.exists(final):
            return
        os.makedirs(directory, exist_ok=True)
        self._replace(directory, final, data)

    def get_chunk(self, hash: str, *, verify: bool = True) -> bytes:
        check_hash(hash)
        data = self._read(self._chunk_path(hash)[1])
        if data is None:
            raise not_found(f"chunk {hash}", chunk=hash)
        if verify:
            verify_chunk(hash, data)
        return data

    def has_chunk(self, hash: str) -> bool:
        check_hash(hash)
        return os.path.exists(self._chunk_path(hash)[1])

    def delete_chunk(self, hash: str) -> bool:
        check_hash(hash)
        directory, final = self._chunk_path(hash)
        try:
            os.unlink(final)
        except FileNotFoundError:
            return False
        self._fsync_dir(directory)
        return True

    def list_chunks(self) -> list[str]:
        out: list[str] = []
        base = os.path.join(self.root, "chunks")
        for fan in os.scandir(base):
            if fan.is_dir():
                out.extend(e.name for e in os.scandir(fan.path) if not e.name.startswith(_TMP))
        return sorted(out)

    # --------------------------------------------------------------- manifests

    def _manifest_path(self, job_id: str, checkpoint_id: str) -> tuple[str, str]:
        check_id("job id", job_id)
        check_id("checkpoint id", checkpoint_id)
        directory = os.path.join(self.root, "manifests", job_id)
        return directory, os.path.join(directory, f"{checkpoint_id}.mf")

    def publish_manifest(self, job_id: str, checkpoint_id: str, data: bytes) -> None:
        directory, final = self._manifest_path(job_id, checkpoint_id)
        data = check_bytes("manifest", data)
        os.makedirs(directory, exist_ok=True)
        # Always fsync'd: the manifest is the commit point of a checkpoint.
        tmp = self._write_tmp(directory, data, sync=True)
        try:
            try:
                os.link(tmp, final)  # atomic, and never replaces a published manifest
            except FileExistsError:
                if self._read(final) != data:
                    raise StalwartError(
                        ErrorKind.ALREADY_EXISTS,
                        f"manifest {job_id}/{checkpoint_id} is already published "
                        "with different content",
                        job=job_id,
                        checkpoint=checkpoint_id,
                    ) from None
            except OSError as e:
                if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EMLINK):
                    raise
                # A file system without hard links: rename (may replace).
                if self._read(final) not in (None, data):
                    raise StalwartError(
                        ErrorKind.ALREADY_EXISTS,
                        f"manifest {job_id}/{checkpoint_id} is already published "
                        "with different content",
                    ) from None
                os.replace(tmp, final)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        self._fsync_dir(directory)

    def get_manifest(self, job_id: str, checkpoint_id: str) -> bytes:
        data = self._read(self._manifest_path(job_id, checkpoint_id)[1])
        if data is None:
            raise not_found(
                f"manifest {job_id}/{checkpoint_id}", job=job_id, checkpoint=checkpoint_id
            )
        return data

    def list_manifests(self, job_id: str) -> list[str]:
        check_id("job id", job_id)
        directory = os.path.join(self.root, "manifests", job_id)
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return []
        return sorted(n[:-3] for n in names if n.endswith(".mf") and not n.startswith(_TMP))

    def list_manifest_jobs(self) -> list[str]:
        base = os.path.join(self.root, "manifests")
        return sorted(
            d.name for d in os.scandir(base)
            if d.is_dir() and any(n.endswith(".mf") and not n.startswith(_TMP)
                                  for n in os.listdir(d.path))
        )  # fmt: skip

    def delete_manifest(self, job_id: str, checkpoint_id: str) -> bool:
        directory, final = self._manifest_path(job_id, checkpoint_id)
        try:
            os.unlink(final)
        except FileNotFoundError:
            return False
        self._fsync_dir(directory)
        return True

    # ---------------------------------------------------------------------- kv

    @property
    def _kv_dir(self) -> str:
        return os.path.join(self.root, "kv")

    def _kv_path(self, key: str) -> str:
        check_key("key", key)
        return os.path.join(self._kv_dir, "k." + key.replace("/", "~"))

    def _kv_lock(self) -> contextlib.AbstractContextManager[None]:
        return self._flocked(os.path.join(self._kv_dir, ".lock"))

    def _kv_remove(self, path: str) -> bool:
        try:
            os.unlink(path)
        except FileNotFoundError:
            return False
        self._fsync_dir(self._kv_dir)
        return True

    def kv_get(self, key: str) -> bytes | None:
        return self._read(self._kv_path(key))

    def kv_put(self, key: str, value: bytes) -> None:
        path = self._kv_path(key)
        value = check_bytes("value", value)
        with self._kv_lock():
            self._replace(self._kv_dir, path, value)

    def kv_cas(self, key: str, expected: bytes | None, new: bytes | None) -> bool:
        path = self._kv_path(key)
        expected = None if expected is None else check_bytes("expected", expected)
        new = None if new is None else check_bytes("value", new)
        with self._kv_lock():
            if self._read(path) != expected:
                return False
            if new is None:
                self._kv_remove(path)
            else:
                self._replace(self._kv_dir, path, new)
            return True

    def kv_delete(self, key: str) -> bool:
        path = self._kv_path(key)
        with self._kv_lock():
            return self._kv_remove(path)

    def kv_list(self, prefix: str = "") -> dict[str, bytes]:
        check_prefix(prefix)
        out: dict[str, bytes] = {}
        for entry in os.scandir(self._kv_dir):
            if not entry.name.startswith("k."):
                continue
            key = entry.name[2:].replace("~", "/")
            if key.startswith(prefix):
                value = self._read(entry.path)
                if value is not None:
                    out[key] = value
        return dict(sorted(out.items()))

    # ------------------------------------------------------------------ leases

    def _lease_dir(self, name: str) -> str:
        check_key("lease name", name)
        directory = os.path.join(self.root, "leases", name.replace("/", "~"))
        os.makedirs(directory, exist_ok=True)
        return directory

    def _read_record(self, directory: str) -> LeaseRecord | None:
        return LeaseRecord.decode(self._read(os.path.join(directory, "state")))

    @staticmethod
    def _holder_alive(directory: str, record: LeaseRecord) -> bool:
        """Whether the process that took ``record`` still holds its flock."""
        try:
            fd = os.open(os.path.join(directory, f"{record.token}.held"), os.O_RDWR)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def acquire_lease(self, name: str, holder: str, ttl_s: float) -> Lease | None:
        directory = self._lease_dir(name)
        check_key("lease holder", holder)
        ttl_s = check_ttl(ttl_s)
        with self._flocked(os.path.join(directory, "lock")):
            current = self._read_record(directory)
            now = time.time()
            alive = (
                current is None or not current.held(now) or self._holder_alive(directory, current)
            )
            record = decide_acquire(current, holder, ttl_s, now, holder_alive=alive)
            if record is None:
                return None
            held_path = os.path.join(directory, f"{record.token}.held")
            fd = os.open(held_path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._replace(directory, os.path.join(directory, "state"), record.encode().encode())
            except BaseException:
                os.close(fd)
                raise
            with self._held_lock:
                self._held[(name, record.token)] = fd
            for entry in os.scandir(directory):  # older holders' lock files
                stem = entry.name.removesuffix(".held")
                if stem != entry.name and stem.isdigit() and int(stem) < record.token:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
            return record.as_lease(name)

    def renew_lease(self, lease: Lease) -> bool:
        directory = self._lease_dir(lease.name)
        with self._flocked(os.path.join(directory, "lock")):
            record = decide_renew(self._read_record(directory), lease, time.time())
            if record is None:
                return False
            self._replace(directory, os.path.join(directory, "state"), record.encode().encode())
            return True

    def release_lease(self, lease: Lease) -> bool:
        directory = self._lease_dir(lease.name)
        with self._flocked(os.path.join(directory, "lock")):
            record = decide_release(self._read_record(directory), lease)
            if record is not None:
                self._replace(directory, os.path.join(directory, "state"), record.encode().encode())
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(directory, f"{lease.token}.held"))
            with self._held_lock:
                fd = self._held.pop((lease.name, lease.token), None)
            if fd is not None:
                os.close(fd)
            return record is not None

    def get_lease(self, name: str) -> Lease | None:
        directory = self._lease_dir(name)
        record = self._read_record(directory)
        if record is None or not record.held(time.time()):
            return None
        if not self._holder_alive(directory, record):
            return None
        return record.as_lease(name)

    def close(self) -> None:
        with self._held_lock:
            fds = list(self._held.values())
            self._held.clear()
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def _bytes_of_files(directory: str) -> int:
    """Sizes of the files in ``directory``, skipping one that goes while it is read:
    other writers rename their temp files into place and retention deletes chunks
    while a save asks how full the store is, which must not fail that save."""
    total = 0
    for entry in os.scandir(directory):
        with contextlib.suppress(FileNotFoundError):
            if entry.is_file():
                total += entry.stat().st_size
    return total
