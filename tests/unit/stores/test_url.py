"""Store URL parsing: every scheme, defaults, options, and clear refusals."""

from __future__ import annotations

import pytest

from stalwart.errors import ErrorKind, StalwartError
from stalwart.stores import open_store, parse_store_url
from stalwart.stores.common import DEFAULT_CONNECT_TIMEOUT_S, DEFAULT_OP_TIMEOUT_S


@pytest.mark.parametrize(
    ("url", "scheme", "path"),
    [
        ("shm:///dev/shm/stalwart", "shm", "/dev/shm/stalwart"),
        ("shm:///dev/shm/stalwart/", "shm", "/dev/shm/stalwart"),
        ("file:///var/lib/stalwart", "file", "/var/lib/stalwart"),
        ("file://localhost/mnt/vol", "file", "/mnt/vol"),
        ("FILE:///a//b", "file", "/a/b"),
        ("file:///with%20space", "file", "/with space"),
    ],
)
def test_local_urls(url: str, scheme: str, path: str) -> None:
    parsed = parse_store_url(url)
    assert (parsed.scheme, parsed.path, parsed.hosts) == (scheme, path, ())
    assert parsed.redacted == f"{scheme}://{path}"


@pytest.mark.parametrize(
    ("url", "hosts", "db"),
    [
        ("redis://127.0.0.1:6379/0", (("127.0.0.1", 6379),), 0),
        ("redis://redis:7000/3", (("redis", 7000),), 3),
        ("redis://localhost", (("localhost", 6379),), 0),
        ("redis://localhost/", (("localhost", 6379),), 0),
        ("rediss://[::1]:6380/1", (("::1", 6380),), 1),
    ],
)
def test_redis_urls(url: str, hosts: tuple, db: int) -> None:
    parsed = parse_store_url(url)
    assert (parsed.hosts, parsed.db) == (hosts, db)
    assert parsed.connect_timeout_s == DEFAULT_CONNECT_TIMEOUT_S
    assert parsed.timeout_s == DEFAULT_OP_TIMEOUT_S


@pytest.mark.parametrize(
    ("url", "hosts"),
    [
        ("ignite://127.0.0.1:10800", (("127.0.0.1", 10800),)),
        ("ignite://ignite", (("ignite", 10800),)),
        (
            "ignite://h1:10800,h2:10801,[fe80::1]:10802",
            (("h1", 10800), ("h2", 10801), ("fe80::1", 10802)),
        ),
    ],
)
def test_ignite_urls(url: str, hosts: tuple) -> None:
    assert parse_store_url(url).hosts == hosts


def test_options_and_redaction() -> None:
    parsed = parse_store_url("redis://app:s3cret@db:6379/2?connect_timeout=0.5&timeout=7")
    assert (parsed.username, parsed.password) == ("app", "s3cret")
    assert (parsed.connect_timeout_s, parsed.timeout_s) == (0.5, 7.0)
    assert "s3cret" not in parsed.redacted
    assert parsed.redacted == "redis://app:***@db:6379/2"
    assert parse_store_url("ignite://a:1,b:2").redacted == "ignite://a:1,b:2"


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("", "expected scheme"),
        ("/dev/shm/x", "expected scheme"),
        ("s3://bucket/x", "unknown scheme"),
        ("shm://", "absolute directory"),
        ("shm:///", "absolute directory"),
        ("shm://otherhost/x", "only local paths"),
        ("file:///a/../b", "'.' or '..'"),
        ("shm:///x?timeout=1", "takes no options"),
        ("redis://", "needs host:port"),
        ("redis://h:0/0", "bad port"),
        ("redis://h:70000/0", "bad port"),
        ("redis://h:abc/0", "bad port"),
        ("redis://h:1/16", "0..15"),
        ("redis://h:1/x", "0..15"),
        ("redis://a:1,b:2/0", "exactly one host"),
        ("ignite://h:1/path", "takes no path"),
        ("ignite://::1:10800", "IPv6"),
        ("ignite://h:1?retries=3", "unknown option"),
        ("ignite://h:1?timeout=abc", "must be seconds"),
        ("ignite://h:1?timeout=0", "(0, 3600]"),
        ("redis://u:pw@h:1/0#frag", "fragments"),
    ],
)
def test_bad_urls_are_invalid_argument(url: str, why: str) -> None:
    with pytest.raises(StalwartError) as err:
        parse_store_url(url)
    assert err.value.kind is ErrorKind.INVALID_ARGUMENT
    assert why in err.value.message
    assert "pw" not in err.value.message


def test_open_store_refuses_bad_url_before_any_io() -> None:
    with pytest.raises(StalwartError) as err:
        open_store("nosuch://x")
    assert err.value.kind is ErrorKind.INVALID_ARGUMENT
