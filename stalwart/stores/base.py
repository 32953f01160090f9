"""The store interface every backend implements.

A store holds four kinds of things:

* **chunks**: immutable blobs addressed by the SHA-256 of their content;
* **manifests**: one small blob per (job, checkpoint) that lists chunks. A
  manifest is published atomically, after its chunks: readers see it whole or
  not at all, which is what makes a checkpoint "complete or invisible";
* **kv**: small values under ``/``-separated keys, with compare-and-set, for
  cluster state (job specs, membership, assignments, catalog);
* **leases**: named, time-limited ownership with a fencing token that grows
  every time the lease changes hands (leader election, primaries).

Every method raises :class:`~stalwart.errors.StalwartError`: ``UNAVAILABLE``
when the backend cannot be reached (retry), ``INVALID_ARGUMENT`` for bad names,
``NOT_FOUND`` for a missing chunk or manifest, ``CHECKSUM_MISMATCH`` when a
chunk's bytes do not match its hash. Stores are safe to share between threads.
"""

from __future__ import annotations

import abc
from types import TracebackType

from stalwart.stores.common import Capacity, Lease

__all__ = ["Capacity", "Lease", "Store"]


class Store(abc.ABC):
    """One connection to one backend, chosen by URL through ``open_store``."""

    #: The URL this store was opened with, password removed.
    url: str

    # ------------------------------------------------------------------ chunks

    @abc.abstractmethod
    def put_chunk(self, hash: str, data: bytes | memoryview, *, verified: bool = False) -> None:
        """Store ``data`` under ``hash`` (its lowercase hex SHA-256).

        Idempotent. Raises CHECKSUM_MISMATCH, storing nothing, when ``data``
        does not hash to ``hash``.

        ``verified=True`` skips that check, and only that one: pass it only when
        the caller has itself just computed ``hash`` from these very bytes
        (the checkpoint writer, which hashes each chunk for its address; a copy
        that has just verified the chunk it read). Hashing a chunk again here
        would cost as much as the whole write. A memoryview passed with it is
        stored without a copy where the backend can, so its bytes must not
        change until the call returns. Readers still check every chunk against
        its hash, so a wrong word stores a chunk nobody will accept, not a
        silent corruption.
        """

    @abc.abstractmethod
    def get_chunk(self, hash: str, *, verify: bool = True) -> bytes:
        """The chunk's bytes. NOT_FOUND if absent; CHECKSUM_MISMATCH if ``verify``
        and the stored bytes no longer match the hash."""

    @abc.abstractmethod
    def has_chunk(self, hash: str) -> bool:
        """Whether a chunk is stored under ``hash``."""

    @abc.abstractmethod
    def delete_chunk(self, hash: str) -> bool:
        """Remove a chunk; True if it existed."""

    @abc.abstractmethod
    def list_chunks(self) -> list[str]:
        """Every stored chunk hash, sorted."""

    # --------------------------------------------------------------- manifests

    @abc.abstractmethod
    def publish_manifest(self, job_id: str, checkpoint_id: str, data: bytes) -> None:
        """Make a manifest visible, atomically: all of ``data`` or nothing.

        Publish after every chunk it lists is stored. Publishing the same bytes
        again is a no-op; different bytes under an existing id raise
        ALREADY_EXISTS (published manifests are immutable).
        """

    @abc.abstractmethod
    def get_manifest(self, job_id: str, checkpoint_id: str) -> bytes:
        """A published manifest's bytes; NOT_FOUND if there is none."""

    @abc.abstractmethod
    def list_manifests(self, job_id: str) -> list[str]:
        """Checkpoint ids with a published manifest for ``job_id``, sorted."""

    @abc.abstractmethod
    def list_manifest_jobs(self) -> list[str]:
        """Every job id with at least one published manifest, sorted: the jobs whose
        checkpoints may reference a chunk (chunks are shared between jobs)."""

    @abc.abstractmethod
    def delete_manifest(self, job_id: str, checkpoint_id: str) -> bool:
        """Unpublish a manifest (its chunks stay); True if it existed."""

    # ---------------------------------------------------------------------- kv

    @abc.abstractmethod
    def kv_get(self, key: str) -> bytes | None:
        """The value under ``key``, or None."""

    @abc.abstractmethod
    def kv_put(self, key: str, value: bytes) -> None:
        """Set ``key`` to ``value`` unconditionally."""

    @abc.abstractmethod
    def kv_cas(self, key: str, expected: bytes | None, new: bytes | None) -> bool:
        """Atomically set ``key`` to ``new`` if its value is ``expected``.

        ``expected=None`` means "only if absent"; ``new=None`` deletes. Returns
        whether the swap happened.
        """

    @abc.abstractmethod
    def kv_delete(self, key: str) -> bool:
        """Remove ``key``; True if it existed."""

    @abc.abstractmethod
    def kv_list(self, prefix: str = "") -> dict[str, bytes]:
        """Every key starting with ``prefix`` and its value, sorted by key."""

    # ------------------------------------------------------------------ leases

    @abc.abstractmethod
    def acquire_lease(self, name: str, holder: str, ttl_s: float) -> Lease | None:
        """Take the lease ``name`` for ``holder`` if nobody holds it; else None.

        A successful acquisition always returns a fencing token larger than any
        token issued before for ``name``. A lease held by anyone (``holder``
        included) is not acquired again: extend it with ``renew_lease``.
        """

    @abc.abstractmethod
    def renew_lease(self, lease: Lease) -> bool:
        """Extend ``lease`` by its ttl from now. False if it expired or is held by
        someone else (then stop acting as its holder)."""

    @abc.abstractmethod
    def release_lease(self, lease: Lease) -> bool:
        """Give ``lease`` up so another holder can take it at once; True if it
        was still held by ``lease``."""

    @abc.abstractmethod
    def get_lease(self, name: str) -> Lease | None:
        """The current holder of ``name``, or None if it is free."""

    # ---------------------------------------------------------------- capacity

    def capacity(self) -> Capacity | None:
        """What the store holds and may hold, or None when it has no known limit.

        The limit is the URL's ``budget_mb`` or what the backend itself
        enforces (free disk or tmpfs space, Redis ``maxmemory``), whichever is
        lower. Checkpoint writers check it before writing (stalwart.checkpoint):
        a store driven past its limit refuses writes at best and halts at worst
        (an Ignite node out of data-region memory stops)."""
        return None

    # ------------------------------------------------------------------ admin

    def close(self) -> None:  # noqa: B027 - optional hook, default no-op
        """Release connections, file handles and any leases' OS locks."""

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"
