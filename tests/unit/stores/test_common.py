"""The pure parts of the store layer: hashing, name rules, lease decisions."""

from __future__ import annotations

import hashlib
import os

import google_crc32c
import pytest

from stalwart.errors import ErrorKind, StalwartError
from stalwart.stores import Lease, chunk_hash, crc32c, verify_chunk
from stalwart.stores.common import (
    LeaseRecord,
    check_chunk,
    check_id,
    check_key,
    check_ttl,
    decide_acquire,
    decide_release,
    decide_renew,
    describe_os_error,
)


def test_hashes() -> None:
    data = b"stalwart" * 1000
    assert chunk_hash(data) == hashlib.sha256(data).hexdigest()
    assert crc32c(data) == google_crc32c.value(data)
    assert crc32c(memoryview(data)) == crc32c(data)
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    # views go through in pieces: any length, any item format, same value
    big = bytes(range(256)) * 1111  # not a multiple of the piece size
    assert crc32c(memoryview(big)) == google_crc32c.value(big)
    assert crc32c(memoryview(big).cast("I", (len(big) // 4,))) == google_crc32c.value(big)
    assert crc32c(memoryview(b"")) == crc32c(b"") == 0
    verify_chunk(chunk_hash(data), data)
    with pytest.raises(StalwartError) as err:
        verify_chunk(chunk_hash(data), data[:-1])
    assert err.value.kind is ErrorKind.CHECKSUM_MISMATCH


def test_check_chunk() -> None:
    data = os.urandom(5000)
    h = chunk_hash(data)
    assert check_chunk(h, data, verified=False) is data
    got = check_chunk(h, bytearray(data), verified=False)
    assert type(got) is bytes and got == data
    with pytest.raises(StalwartError) as err:
        check_chunk(chunk_hash(b"x"), data, verified=False)
    assert err.value.kind is ErrorKind.CHECKSUM_MISMATCH
    # verified: no hash check; a view is kept only where the backend takes views
    assert check_chunk(chunk_hash(b"x"), data, verified=True) is data
    view = memoryview(data)
    assert type(check_chunk(h, view, verified=True)) is bytes
    assert check_chunk(h, view, verified=True, views=True).obj is data
    for bad_hash in ("", "A" * 64):
        with pytest.raises(StalwartError) as err:
            check_chunk(bad_hash, data, verified=True)
        assert err.value.kind is ErrorKind.INVALID_ARGUMENT
    with pytest.raises(StalwartError) as err:
        check_chunk(h, "text", verified=True, views=True)
    assert err.value.kind is ErrorKind.INVALID_ARGUMENT


@pytest.mark.parametrize("good", ["job-1", "a", "step_100.v2", "x@host:1", "A" * 128])
def test_good_ids(good: str) -> None:
    assert check_id("job id", good) == good


@pytest.mark.parametrize("bad", ["", ".hidden", "-x", "a/b", "a b", "A" * 129, "é", None])
def test_bad_ids(bad: object) -> None:
    with pytest.raises(StalwartError) as err:
        check_id("job id", bad)  # type: ignore[arg-type]
    assert err.value.kind is ErrorKind.INVALID_ARGUMENT


@pytest.mark.parametrize("good", ["jobs/j1/slots/3", "leader", "a:b@c=d+e-f_g.h"])
def test_good_keys(good: str) -> None:
    assert check_key("key", good) == good


@pytest.mark.parametrize("bad", ["", ".x", "a//b", "a|b", "a*", "a b", "k" * 201])
def test_bad_keys(bad: str) -> None:
    with pytest.raises(StalwartError):
        check_key("key", bad)


@pytest.mark.parametrize("bad", [0, -1, 0.001, 86401, "5", None])
def test_bad_ttls(bad: object) -> None:
    with pytest.raises(StalwartError):
        check_ttl(bad)  # type: ignore[arg-type]


def test_describe_os_error() -> None:
    assert describe_os_error(ConnectionRefusedError(111, "Connection refused")) == (
        "connection refused"
    )
    assert describe_os_error(TimeoutError()) == "timed out"
    wrapped = RuntimeError("outer")
    wrapped.__cause__ = ConnectionRefusedError(111, "Connection refused")
    assert describe_os_error(wrapped) == "connection refused"
    assert describe_os_error(RuntimeError("Error connecting: timed out")) == "timed out"


# ------------------------------------------------------------------ lease decisions

NOW = 1000.0


def rec(holder: str, token: int, expires_at: float) -> LeaseRecord:
    return LeaseRecord(holder, token, expires_at, 10.0)


@pytest.mark.parametrize(
    ("current", "alive", "expected_token"),
    [
        (None, True, 1),  # never taken
        (rec("", 4, 0.0), True, 5),  # released: token continues
        (rec("a", 4, NOW - 0.001), True, 5),  # expired
        (rec("a", 4, NOW + 5), False, 5),  # holder dead (flock gone)
        (rec("a", 4, NOW + 5), True, None),  # held
        (rec("b", 4, NOW + 5), True, None),  # held by someone else
    ],
)
def test_decide_acquire(
    current: LeaseRecord | None, alive: bool, expected_token: int | None
) -> None:
    out = decide_acquire(current, "b", 10.0, NOW, holder_alive=alive)
    if expected_token is None:
        assert out is None
    else:
        assert out == LeaseRecord("b", expected_token, NOW + 10.0, 10.0)


def test_decide_renew() -> None:
    lease = Lease("l", "a", 4, NOW + 5, 10.0)
    assert decide_renew(rec("a", 4, NOW + 5), lease, NOW) == rec("a", 4, NOW + 10.0)
    assert decide_renew(rec("a", 4, NOW - 1), lease, NOW) is None  # expired
    assert decide_renew(rec("a", 5, NOW + 5), lease, NOW) is None  # newer token
    assert decide_renew(rec("b", 4, NOW + 5), lease, NOW) is None  # other holder
    assert decide_renew(rec("", 4, 0.0), lease, NOW) is None  # released
    assert decide_renew(None, lease, NOW) is None


def test_decide_release() -> None:
    lease = Lease("l", "a", 4, NOW + 5, 10.0)
    assert decide_release(rec("a", 4, NOW + 5), lease) == LeaseRecord("", 4, 0.0, 10.0)
    assert decide_release(rec("a", 4, NOW - 5), lease) == LeaseRecord("", 4, 0.0, 10.0)
    assert decide_release(rec("b", 5, NOW + 5), lease) is None
    assert decide_release(rec("", 4, 0.0), lease) is None
    assert decide_release(None, lease) is None


def test_lease_record_round_trip() -> None:
    r = rec("holder/1", 7, 12.5)
    assert LeaseRecord.decode(r.encode()) == r
    assert LeaseRecord.decode(r.encode().encode()) == r
    assert LeaseRecord.decode(None) is None
    assert r.as_lease("n") == Lease("n", "holder/1", 7, 12.5, 10.0)
