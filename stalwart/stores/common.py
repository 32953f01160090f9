"""What every backend shares: URL parsing, hashing, name rules, lease decisions.

Nothing here touches a network or a disk. The lease functions are the one
state machine all lease-by-record backends (shm/file, ignite) run: they are
fed the current record and the clock and answer with the record to write, or
``None`` when the operation must not happen.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote

from stalwart.crc import crc32c  # noqa: F401 - the stores' checksum, re-exported
from stalwart.errors import ErrorKind, StalwartError

# --------------------------------------------------------------------------- URLs

SCHEMES = ("shm", "file", "redis", "rediss", "ignite")
DEFAULT_PORTS = {"redis": 6379, "rediss": 6379, "ignite": 10800}

#: Query options every networked backend understands (seconds).
DEFAULT_CONNECT_TIMEOUT_S = 3.0
DEFAULT_OP_TIMEOUT_S = 30.0
_OPTIONS = {"connect_timeout", "timeout"}
# Checkpoint budget in MiB (``?budget_mb=``): every scheme takes it.
BUDGET_OPTION = "budget_mb"
MAX_BUDGET_MB = 1 << 30


@dataclass(frozen=True)
class Capacity:
    """How much a store holds and may hold, in bytes (see ``Store.capacity``)."""

    used_bytes: int
    limit_bytes: int

    @property
    def free_bytes(self) -> int:
        return max(0, self.limit_bytes - self.used_bytes)


@dataclass(frozen=True)
class StoreURL:
    """A parsed store URL.

    ``hosts`` is empty for ``shm``/``file``; ``path`` is the directory for those
    and unused for the others; ``db`` is the Redis database number.
    """

    scheme: str
    hosts: tuple[tuple[str, int], ...] = ()
    path: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = None
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    timeout_s: float = DEFAULT_OP_TIMEOUT_S
    budget_bytes: int = 0  # 0: no budget beyond what the backend itself reports

    @property
    def redacted(self) -> str:
        """The URL as it may appear in logs and error messages (no password)."""
        if self.scheme in ("shm", "file"):
            return f"{self.scheme}://{self.path}"
        hosts = ",".join(_format_host(h, p) for h, p in self.hosts)
        user = f"{self.username or ''}:***@" if self.password else ""
        tail = f"/{self.db}" if self.scheme in ("redis", "rediss") else ""
        return f"{self.scheme}://{user}{hosts}{tail}"


def _format_host(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _bad_url(url: str, why: str) -> StalwartError:
    shown = url if "@" not in url else url.split("://", 1)[0] + "://***@" + url.rsplit("@", 1)[1]
    return StalwartError(ErrorKind.INVALID_ARGUMENT, f"bad store URL {shown!r}: {why}", url=shown)


def parse_store_url(url: str) -> StoreURL:
    """Parse ``shm://``, ``file://``, ``redis://``, ``rediss://`` or ``ignite://`` URLs.

    Raises StalwartError(INVALID_ARGUMENT) naming the URL and what is wrong.
    """
    if not isinstance(url, str) or "://" not in url:
        raise _bad_url(str(url), "expected scheme://..., e.g. shm:///dev/shm/stalwart")
    scheme, rest = url.split("://", 1)
    scheme = scheme.lower()
    if scheme not in SCHEMES:
        raise _bad_url(url, f"unknown scheme {scheme!r}; expected one of {', '.join(SCHEMES)}")
    rest, _, query = rest.partition("?")
    if "#" in rest or "#" in query:
        raise _bad_url(url, "fragments are not allowed")
    budget = _parse_budget(url, query)
    query = "&".join(p for p in query.split("&") if not p.startswith(BUDGET_OPTION + "="))
    options = _parse_options(url, query)

    if scheme in ("shm", "file"):
        if options:
            raise _bad_url(url, f"{scheme}:// takes no options but {BUDGET_OPTION}")
        netloc, _, path = rest.partition("/")
        if netloc not in ("", "localhost"):
            raise _bad_url(url, "only local paths are supported (shm:///abs/path)")
        path = "/" + unquote(path)
        if path == "/" or "\x00" in path:
            raise _bad_url(url, "needs an absolute directory path, e.g. file:///var/lib/stalwart")
        parts = [p for p in path.split("/") if p]
        if any(p in (".", "..") for p in parts):
            raise _bad_url(url, "path must not contain '.' or '..'")
        return StoreURL(scheme=scheme, path="/" + "/".join(parts), budget_bytes=budget)

    netloc, _, path = rest.partition("/")
    username = password = None
    if "@" in netloc:
        creds, netloc = netloc.rsplit("@", 1)
        user, sep, pw = creds.partition(":")
        username = unquote(user) or None
        password = unquote(pw) if sep else None
    if not netloc:
        raise _bad_url(url, "needs host:port")
    hosts = tuple(_parse_host(url, part, DEFAULT_PORTS[scheme]) for part in netloc.split(","))
    db = 0
    if scheme in ("redis", "rediss"):
        if len(hosts) != 1:
            raise _bad_url(url, "redis takes exactly one host:port")
        if path:
            if not path.isdigit() or int(path) > 15:
                raise _bad_url(url, f"database must be a number 0..15, got {path!r}")
            db = int(path)
    elif path:
        raise _bad_url(url, "ignite:// takes no path; list nodes as host:port,host2:port")
    return StoreURL(
        scheme=scheme,
        hosts=hosts,
        db=db,
        username=username,
        password=password,
        connect_timeout_s=options.get("connect_timeout", DEFAULT_CONNECT_TIMEOUT_S),
        timeout_s=options.get("timeout", DEFAULT_OP_TIMEOUT_S),
        budget_bytes=budget,
    )


def _parse_host(url: str, part: str, default_port: int) -> tuple[str, int]:
    if part.startswith("["):
        host, sep, tail = part[1:].partition("]")
        if not sep or (tail and not tail.startswith(":")):
            raise _bad_url(url, f"bad IPv6 host {part!r}")
        port_s = tail[1:]
    else:
        if part.count(":") > 1:
            raise _bad_url(url, f"bad host {part!r} (write IPv6 addresses in brackets)")
        host, _, port_s = part.partition(":")
    if not host or not re.fullmatch(r"[A-Za-z0-9._:%-]+", host):
        raise _bad_url(url, f"bad host {part!r}")
    if port_s == "":
        return host, default_port
    if not port_s.isdigit() or not 0 < int(port_s) < 65536:
        raise _bad_url(url, f"bad port in {part!r}")
    return host, int(port_s)


def _parse_budget(url: str, query: str) -> int:
    """``budget_mb=N`` -> N MiB in bytes (0 when absent)."""
    values = [v for k, v in parse_qsl(query, keep_blank_values=True) if k == BUDGET_OPTION]
    if not values:
        return 0
    if len(values) > 1 or not values[0].isdigit() or not 0 < int(values[0]) <= MAX_BUDGET_MB:
        raise _bad_url(
            url, f"option {BUDGET_OPTION} must be a whole number of MiB, 1..{MAX_BUDGET_MB}"
        )
    return int(values[0]) << 20


def _parse_options(url: str, query: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=False):
        if key not in _OPTIONS:
            raise _bad_url(url, f"unknown option {key!r}; known: {', '.join(sorted(_OPTIONS))}")
        try:
            seconds = float(value)
        except ValueError:
            raise _bad_url(url, f"option {key} must be seconds, got {value!r}") from None
        if not 0 < seconds <= 3600:
            raise _bad_url(url, f"option {key} must be in (0, 3600] seconds")
        out[key] = seconds
    return out


# ------------------------------------------------------------------------ hashing

_HASH_RE = re.compile(r"[0-9a-f]{64}")


def chunk_hash(data: bytes | bytearray | memoryview) -> str:
    """The content address of a chunk: lowercase hex SHA-256."""
    return hashlib.sha256(data).hexdigest()


def check_hash(value: str) -> str:
    if not isinstance(value, str) or not _HASH_RE.fullmatch(value):
        raise StalwartError(
            ErrorKind.INVALID_ARGUMENT,
            f"chunk hash must be 64 lowercase hex digits (sha256), got {str(value)[:80]!r}",
        )
    return value


def verify_chunk(expected_hash: str, data: bytes | memoryview) -> None:
    """Raise CHECKSUM_MISMATCH unless ``data`` hashes to ``expected_hash``."""
    actual = chunk_hash(data)
    if actual != expected_hash:
        raise StalwartError(
            ErrorKind.CHECKSUM_MISMATCH,
            f"chunk {expected_hash[:16]}... does not match its content (sha256 {actual[:16]}...)",
            chunk=expected_hash,
        )


# ------------------------------------------------------------------------- names

_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@=+-]{0,127}")
MAX_KEY_CHARS = 200  # of a KV key, lease name or holder
_KEY_RE = re.compile(rf"[A-Za-z0-9._:@=+/-]{{1,{MAX_KEY_CHARS}}}")
MAX_VALUE_BYTES = 512 << 20


def check_id(kind: str, value: str) -> str:
    """Job ids, checkpoint ids: 1-128 of ``A-Z a-z 0-9 . _ : @ = + -``, no leading symbol."""
    if not isinstance(value, str) or not _ID_RE.fullmatch(value):
        raise StalwartError(
            ErrorKind.INVALID_ARGUMENT,
            f"{kind} must be 1-128 characters of A-Z a-z 0-9 . _ : @ = + - "
            f"starting with a letter or digit, got {str(value)[:80]!r}",
        )
    return value


def check_key(kind: str, value: str) -> str:
    """KV keys, lease names and holders: 1-200 of ``A-Z a-z 0-9 . _ : @ = + - /``."""
    if (
        not isinstance(value, str)
        or not _KEY_RE.fullmatch(value)
        or value.startswith(".")
        or "//" in value
    ):
        raise StalwartError(
            ErrorKind.INVALID_ARGUMENT,
            f"{kind} must be 1-200 characters of A-Z a-z 0-9 . _ : @ = + - / "
            f"(not starting with '.', no '//'), got {str(value)[:80]!r}",
        )
    return value


def check_prefix(value: str) -> str:
    if value == "":
        return value
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9._:@=+/-]{0,200}", value):
        raise StalwartError(ErrorKind.INVALID_ARGUMENT, f"bad key prefix {str(value)[:80]!r}")
    return value


def check_bytes(kind: str, value: object) -> bytes:
    if isinstance(value, bytearray | memoryview):
        value = bytes(value)
    if not isinstance(value, bytes):
        raise StalwartError(
            ErrorKind.INVALID_ARGUMENT, f"{kind} must be bytes, got {type(value).__name__}"
        )
    if len(value) > MAX_VALUE_BYTES:
        raise StalwartError(
            ErrorKind.LIMIT_EXCEEDED,
            f"{kind} of {len(value)} bytes exceeds the {MAX_VALUE_BYTES} byte limit",
        )
    return value


def check_chunk(
    hash: str, data: object, *, verified: bool, views: bool = False
) -> bytes | memoryview:
    """What every ``put_chunk`` does first: check the hash's form and the data's
    type and size, then (unless ``verified``) that ``data`` hashes to ``hash``.
    Returns the bytes to store.

    ``verified=True`` is the caller's word that it computed ``hash`` from these
    very bytes just before the call (see ``Store.put_chunk``). Only then may a
    memoryview be stored as it is (``views=True``: for backends that write a
    buffer without needing bytes); otherwise it is copied first, so that what
    is checked is what is stored.
    """
    check_hash(hash)
    if verified and views and isinstance(data, memoryview):
        view = data if data.format == "B" and data.ndim == 1 else data.cast("B")
        if len(view) > MAX_VALUE_BYTES:
            raise StalwartError(
                ErrorKind.LIMIT_EXCEEDED,
                f"chunk of {len(view)} bytes exceeds the {MAX_VALUE_BYTES} byte limit",
            )
        return view
    data = check_bytes("chunk", data)
    if not verified:
        verify_chunk(hash, data)
    return data


def check_ttl(ttl_s: float) -> float:
    if not isinstance(ttl_s, int | float) or not 0.01 <= ttl_s <= 86400:
        raise StalwartError(
            ErrorKind.INVALID_ARGUMENT, f"lease ttl must be 0.01..86400 seconds, got {ttl_s!r}"
        )
    return float(ttl_s)


# ------------------------------------------------------------------------ errors


def describe_os_error(exc: BaseException) -> str:
    """A short lowercase reason ("connection refused", "timed out") for a network error."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, TimeoutError):
            return "timed out"
        if isinstance(cur, OSError) and cur.errno is not None:
            if cur.errno == errno.ECONNREFUSED:
                return "connection refused"
            return (cur.strerror or errno.errorcode.get(cur.errno, str(cur))).lower()
        cur = cur.__cause__ or cur.__context__
    text = str(exc).lower()
    for needle, reason in (
        ("refused", "connection refused"),
        ("timed out", "timed out"),
        ("timeout", "timed out"),
        ("name or service not known", "unknown host"),
    ):
        if needle in text:
            return reason
    return str(exc) or type(exc).__name__


def unavailable(url: str, exc: BaseException) -> StalwartError:
    return StalwartError(
        ErrorKind.UNAVAILABLE, f"cannot reach store {url}: {describe_os_error(exc)}", store=url
    )


def store_full(url: str, exc: BaseException) -> StalwartError:
    """The store refused a write for want of room (a full tmpfs or disk, Redis at its
    maxmemory): STORE_FULL, as a budget's refusal, not an INTERNAL error."""
    return StalwartError(
        ErrorKind.STORE_FULL,
        f"store {url} is full: {describe_os_error(exc) if isinstance(exc, OSError) else exc}; "
        "not written (the last complete checkpoint stays valid). Free room or delete "
        "checkpoints.",
        store=url,
    )


def not_found(what: str, **metadata: object) -> StalwartError:
    return StalwartError(ErrorKind.NOT_FOUND, f"{what} not found", **metadata)


# ------------------------------------------------------------------------ leases


@dataclass(frozen=True)
class Lease:
    """A held lease.

    ``token`` is the fencing token: it grows every time the lease changes hands,
    so a write carrying a smaller token than the newest one seen must be refused.
    ``expires_at`` is the acquirer's wall clock (seconds since the epoch) when
    the lease lapses unless renewed.
    """

    name: str
    holder: str
    token: int
    expires_at: float
    ttl_s: float


@dataclass(frozen=True)
class LeaseRecord:
    """What a record-based backend stores per lease name. Never deleted: a freed
    lease keeps its last token (holder ``""``), so the next token is always larger."""

    holder: str
    token: int
    expires_at: float
    ttl_s: float

    def held(self, now: float) -> bool:
        return bool(self.holder) and self.expires_at > now

    def encode(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def decode(cls, raw: str | bytes | None) -> LeaseRecord | None:
        if raw is None:
            return None
        d = json.loads(raw)
        return cls(str(d["holder"]), int(d["token"]), float(d["expires_at"]), float(d["ttl_s"]))

    def as_lease(self, name: str) -> Lease:
        return Lease(name, self.holder, self.token, self.expires_at, self.ttl_s)


def decide_acquire(
    current: LeaseRecord | None, holder: str, ttl_s: float, now: float, holder_alive: bool = True
) -> LeaseRecord | None:
    """The record to write so that ``holder`` takes the lease, or None if it is held.

    A lease is free when it was never taken, was released, has expired, or its
    holder is known dead (``holder_alive=False``, e.g. its flock is gone).
    Taking it always issues the next token, even to the previous holder.
    """
    if current is not None and current.held(now) and holder_alive:
        return None
    token = (current.token if current is not None else 0) + 1
    return LeaseRecord(holder, token, now + ttl_s, ttl_s)


def decide_renew(current: LeaseRecord | None, lease: Lease, now: float) -> LeaseRecord | None:
    """The record extending ``lease`` by its ttl, or None if it is no longer held by it."""
    if current is None or not current.held(now):
        return None
    if current.holder != lease.holder or current.token != lease.token:
        return None
    return dataclasses.replace(current, expires_at=now + current.ttl_s)


def decide_release(current: LeaseRecord | None, lease: Lease) -> LeaseRecord | None:
    """The record freeing ``lease`` (token kept), or None if ``lease`` does not hold it."""
    if current is None or current.holder != lease.holder or current.token != lease.token:
        return None
    if not current.holder:
        return None
    return LeaseRecord("", current.token, 0.0, current.ttl_s)
