"""``k8s://namespace/prefix``: leases held as Kubernetes ``coordination.k8s.io/v1`` Leases.

Only leases (leader election); chunks, manifests and kv stay in another store.
A store lease ``coordinator/leader`` under ``k8s://stalwart/stalwart`` is the
Lease object ``stalwart-coordinator-leader`` in namespace ``stalwart``.

How it maps onto the Lease object:

* ``spec.holderIdentity`` is the holder (``""`` once released);
  ``spec.leaseDurationSeconds`` the ttl (whole seconds, rounded up, at least 1);
  ``spec.renewTime``/``acquireTime``/``leaseTransitions`` as client-go writes them,
  so ``kubectl get lease`` reads naturally.
* The fencing token lives in the annotation ``stalwart.dev/fencing-token``. It
  grows on every acquisition and is kept on release, so a deposed holder's
  token is always smaller than the current one.
* Every write is a create or a replace carrying the ``resourceVersion`` that
  was read: the API server refuses it (409) if anyone wrote in between, which
  is what makes acquire a compare-and-set.
* Expiry is judged the way client-go judges it: by this process's clock since
  it first *observed* the current record (resourceVersion), not by comparing
  another machine's ``renewTime`` with our clock. Skewed clocks then cannot make
  a candidate take a lease early; a new candidate waits one full duration.

The decisions are plain functions over :class:`LeaseObject`; the API calls sit
behind :class:`LeaseAPI` (three methods), so tests drive everything with a fake.
:class:`KubernetesLeaseAPI` is the real one, with the ``kubernetes`` client
imported only when it is built.
"""

from __future__ import annotations

import dataclasses
import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from stalwart.errors import ErrorKind, StalwartError
from stalwart.stores.common import Lease, check_key, check_ttl

TOKEN_ANNOTATION = "stalwart.dev/fencing-token"
NAME_ANNOTATION = "stalwart.dev/lease-name"

_DNS1123 = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


class Conflict(Exception):
    """The object changed (or already exists) since it was read: someone else wrote."""


@dataclass(frozen=True)
class LeaseObject:
    """The fields of a Kubernetes Lease that the lease logic reads and writes."""

    name: str
    holder: str = ""
    duration_s: int = 1
    renew_time: float = 0.0
    acquire_time: float = 0.0
    transitions: int = 0
    token: int = 0
    lease_name: str = ""
    """The store-level lease name (``coordinator/leader``), kept in an annotation."""
    resource_version: str = ""
    """Set by the API server; empty on an object not yet created."""


class LeaseAPI(Protocol):
    """The three Kubernetes calls the lease logic needs, in one namespace."""

    def read(self, name: str) -> LeaseObject | None:
        """The Lease, or None if there is none."""

    def create(self, obj: LeaseObject) -> LeaseObject:
        """Create it; :class:`Conflict` if it already exists."""

    def replace(self, obj: LeaseObject) -> LeaseObject:
        """Replace it if its resourceVersion is still ``obj.resource_version``, else Conflict."""


# --------------------------------------------------------------------- naming


def parse_k8s_url(url: str) -> tuple[str, str]:
    """``k8s://namespace/prefix`` -> (namespace, prefix); INVALID_ARGUMENT otherwise."""
    scheme, sep, rest = url.partition("://")
    parts = rest.split("/")
    if scheme != "k8s" or not sep or len(parts) != 2 or not all(parts):
        raise StalwartError(
            ErrorKind.INVALID_ARGUMENT,
            f"bad lease URL {url!r}: expected k8s://namespace/prefix, e.g. k8s://stalwart/stalwart",
        )
    namespace, prefix = parts
    for what, value in (("namespace", namespace), ("prefix", prefix)):
        if len(value) > 63 or not _DNS1123.fullmatch(value):
            raise StalwartError(
                ErrorKind.INVALID_ARGUMENT,
                f"bad lease URL {url!r}: {what} must be a DNS-1123 label (a-z, 0-9, '-')",
            )
    return namespace, prefix


def object_name(prefix: str, lease_name: str) -> str:
    """The Lease object's name for a store lease name (``/ _ . : @ = +`` become ``-``)."""
    check_key("lease name", lease_name)
    tail = re.sub(r"[^a-z0-9]+", "-", lease_name.lower()).strip("-")
    name = f"{prefix}-{tail}"
    if len(name) > 253 or not _DNS1123.fullmatch(name):
        raise StalwartError(
            ErrorKind.INVALID_ARGUMENT, f"lease name {lease_name!r} maps to no valid object name"
        )
    return name


# ------------------------------------------------------------------ decisions


def held(current: LeaseObject | None, seen_since: float, now: float) -> bool:
    """Whether ``current`` is held: it has a holder and its duration has not run out
    since ``seen_since``, the local time this resourceVersion was first observed."""
    return current is not None and bool(current.holder) and now < seen_since + current.duration_s


def decide_acquire(
    current: LeaseObject | None,
    name: str,
    lease_name: str,
    holder: str,
    ttl_s: float,
    now: float,
    seen_since: float,
) -> LeaseObject | None:
    """The object to write so ``holder`` takes the lease, or None while someone holds it.

    Like every store backend, a lease held by anyone (``holder`` included) is not
    taken again: it is renewed. Taking it always issues the next fencing token.
    """
    if held(current, seen_since, now):
        return None
    duration = max(1, math.ceil(ttl_s))
    if current is None:
        return LeaseObject(name, holder, duration, now, now, 0, 1, lease_name)
    moved = current.holder not in ("", holder)
    return dataclasses.replace(
        current,
        holder=holder,
        duration_s=duration,
        renew_time=now,
        acquire_time=now,
        transitions=current.transitions + (1 if moved or not current.holder else 0),
        token=current.token + 1,
        lease_name=lease_name,
    )


def decide_renew(
    current: LeaseObject | None, lease: Lease, now: float, deadline: float
) -> LeaseObject | None:
    """The object extending ``lease``, or None if it is no longer ``lease``'s.

    The holder judges its own expiry by its own clock: ``deadline`` is its last
    successful write plus the duration. Past it a candidate may already have
    taken over, so it must stop acting even if the object still names it.
    """
    if current is None or now >= deadline:
        return None
    if current.holder != lease.holder or current.token != lease.token:
        return None
    return dataclasses.replace(current, renew_time=now)


def decide_release(current: LeaseObject | None, lease: Lease) -> LeaseObject | None:
    """The object freeing ``lease`` (token kept), or None if ``lease`` does not hold it."""
    if current is None or not current.holder:
        return None
    if current.holder != lease.holder or current.token != lease.token:
        return None
    return dataclasses.replace(current, holder="", duration_s=1)


def as_lease(obj: LeaseObject, expires_at: float) -> Lease:
    return Lease(obj.lease_name, obj.holder, obj.token, expires_at, float(obj.duration_s))


# ------------------------------------------------------------------ execution


class K8sLeases:
    """acquire/renew/release/get with the same contract as :class:`stalwart.stores.Store`."""

    def __init__(self, api: LeaseAPI, prefix: str, clock: Callable[[], float] = time.time) -> None:
        self._api = api
        self._prefix = prefix
        self._clock = clock
        self._lock = threading.Lock()
        # object name -> (resourceVersion, local time it was first seen)
        self._observed: dict[str, tuple[str, float]] = {}
        # (object name, token) -> when a lease we hold lapses by our own clock
        self._deadlines: dict[tuple[str, int], float] = {}

    @classmethod
    def from_url(cls, url: str) -> K8sLeases:
        namespace, prefix = parse_k8s_url(url)
        return cls(KubernetesLeaseAPI(namespace), prefix)

    def _read(self, name: str, now: float) -> tuple[LeaseObject | None, float]:
        current = self._api.read(name)
        if current is None:
            self._observed.pop(name, None)
            return None, now
        seen = self._observed.get(name)
        if seen is None or seen[0] != current.resource_version:
            seen = (current.resource_version, now)
            self._observed[name] = seen
        return current, seen[1]

    def _write(self, current: LeaseObject | None, new: LeaseObject, now: float) -> bool:
        try:
            written = self._api.replace(new) if current is not None else self._api.create(new)
        except Conflict:
            return False
        self._observed[new.name] = (written.resource_version, now)
        return True

    def acquire_lease(self, name: str, holder: str, ttl_s: float) -> Lease | None:
        check_key("lease holder", holder)
        ttl_s = check_ttl(ttl_s)
        obj_name = object_name(self._prefix, name)
        with self._lock:
            now = self._clock()
            current, seen_since = self._read(obj_name, now)
            new = decide_acquire(current, obj_name, name, holder, ttl_s, now, seen_since)
            if new is None or not self._write(current, new, now):
                return None
            self._deadlines[(obj_name, new.token)] = now + new.duration_s
            return as_lease(new, now + new.duration_s)

    def renew_lease(self, lease: Lease) -> bool:
        obj_name = object_name(self._prefix, lease.name)
        with self._lock:
            now = self._clock()
            current, _ = self._read(obj_name, now)
            key = (obj_name, lease.token)
            new = decide_renew(current, lease, now, self._deadlines.get(key, lease.expires_at))
            if new is None or not self._write(current, new, now):
                self._deadlines.pop(key, None)
                return False
            self._deadlines[key] = now + new.duration_s
            return True

    def release_lease(self, lease: Lease) -> bool:
        obj_name = object_name(self._prefix, lease.name)
        with self._lock:
            now = self._clock()
            current, _ = self._read(obj_name, now)
            new = decide_release(current, lease)
            self._deadlines.pop((obj_name, lease.token), None)
            return new is not None and self._write(current, new, now)

    def get_lease(self, name: str) -> Lease | None:
        obj_name = object_name(self._prefix, name)
        with self._lock:
            now = self._clock()
            current, seen_since = self._read(obj_name, now)
            if current is None or not held(current, seen_since, now):
                return None
            return as_lease(current, seen_since + current.duration_s)


# ------------------------------------------------------- the real API adapter


def _time(value: Any) -> float:
    return value.timestamp() if isinstance(value, datetime) else 0.0


def _micro_time(seconds: float) -> str | None:
    # MicroTime: RFC 3339 with microseconds, in UTC.
    if not seconds:
        return None
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def from_k8s(lease: Any) -> LeaseObject:
    """A :class:`LeaseObject` from the client's ``V1Lease``."""
    meta, spec = lease.metadata, lease.spec
    notes = meta.annotations or {}
    return LeaseObject(
        name=meta.name,
        holder=spec.holder_identity or "",
        duration_s=int(spec.lease_duration_seconds or 1),
        renew_time=_time(spec.renew_time),
        acquire_time=_time(spec.acquire_time),
        transitions=int(spec.lease_transitions or 0),
        token=int(notes.get(TOKEN_ANNOTATION, "0")),
        lease_name=notes.get(NAME_ANNOTATION, ""),
        resource_version=meta.resource_version or "",
    )


def to_k8s(obj: LeaseObject) -> dict[str, Any]:
    """The request body for create/replace (the client serializes plain dicts)."""
    metadata: dict[str, Any] = {
        "name": obj.name,
        "annotations": {TOKEN_ANNOTATION: str(obj.token), NAME_ANNOTATION: obj.lease_name},
        "labels": {"app.kubernetes.io/part-of": "stalwart"},
    }
    if obj.resource_version:
        metadata["resourceVersion"] = obj.resource_version
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": metadata,
        "spec": {
            "holderIdentity": obj.holder or None,
            "leaseDurationSeconds": obj.duration_s,
            "renewTime": _micro_time(obj.renew_time),
            "acquireTime": _micro_time(obj.acquire_time),
            "leaseTransitions": obj.transitions,
        },
    }


class KubernetesLeaseAPI:
    """:class:`LeaseAPI` over the official ``kubernetes`` client (in-cluster config,
    else ~/.kube/config). Needs RBAC get/create/update on leases (deploy/k8s)."""

    def __init__(self, namespace: str, timeout_s: float = 5.0) -> None:
        try:
            from kubernetes import client, config
        except ImportError as exc:
            raise StalwartError(
                ErrorKind.UNAVAILABLE,
                "k8s:// leases need the kubernetes package: pip install kubernetes",
            ) from exc
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        self._api = client.CoordinationV1Api()
        self._api_exception = client.ApiException
        self._namespace = namespace
        self._timeout_s = timeout_s

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args, _request_timeout=self._timeout_s)
        except self._api_exception as exc:
            if exc.status == 409:
                raise Conflict(str(exc.reason)) from exc
            if exc.status == 404:
                return None
            raise StalwartError(
                ErrorKind.UNAVAILABLE, f"kubernetes API: {exc.status} {exc.reason}"
            ) from exc
        except OSError as exc:  # urllib3 connection errors are OSErrors
            raise StalwartError(ErrorKind.UNAVAILABLE, f"kubernetes API: {exc}") from exc

    def read(self, name: str) -> LeaseObject | None:
        lease = self._call(self._api.read_namespaced_lease, name, self._namespace)
        return None if lease is None else from_k8s(lease)

    def create(self, obj: LeaseObject) -> LeaseObject:
        lease = self._call(self._api.create_namespaced_lease, self._namespace, to_k8s(obj))
        return from_k8s(lease)

    def replace(self, obj: LeaseObject) -> LeaseObject:
        lease = self._call(
            self._api.replace_namespaced_lease, obj.name, self._namespace, to_k8s(obj)
        )
        if lease is None:  # deleted since it was read: treat like any lost race
            raise Conflict(f"lease {obj.name} disappeared")
        return from_k8s(lease)
