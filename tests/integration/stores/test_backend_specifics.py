"""What only some backends do: flock leases that die with their process (shm/file),
Ignite's cache layout, and clear errors when a server cannot be reached."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from stalwart.errors import ErrorKind, StalwartError
from stalwart.stores import chunk_hash, open_store
from tests.backends import (
    BackendUnavailable,
    skip_or_fail,
    start_ignite,
    start_redis,
    stop_ignite,
    stop_redis,
)

_HOLDER = textwrap.dedent(
    """
    import sys, time
    from stalwart.stores import open_store
    store = open_store(sys.argv[1])
    lease = store.acquire_lease(sys.argv[2], "doomed-holder", 600)
    print(lease.token if lease else "none", flush=True)
    time.sleep(600)
    """
)


@pytest.mark.parametrize("backend", ["shm", "file"])
def test_lease_of_a_killed_holder_process_is_free_at_once(
    request: pytest.FixtureRequest, backend: str, uniq: str
) -> None:
    """SIGKILL drops the holder's flock: the lease is free long before its 600 s TTL."""
    url = request.getfixturevalue(f"{backend}_url")
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, url, uniq], stdout=subprocess.PIPE, text=True
    )
    try:
        first = holder.stdout.readline().strip()
        assert first.isdigit(), first
        with open_store(url) as store:
            assert store.acquire_lease(uniq, "successor", 5) is None  # holder alive: held
            held = store.get_lease(uniq)
            assert held is not None and held.holder == "doomed-holder"

            holder.send_signal(signal.SIGKILL)
            holder.wait(timeout=30)
            assert store.get_lease(uniq) is None
            lease = store.acquire_lease(uniq, "successor", 5)
            assert lease is not None and lease.token > int(first)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=30)


@pytest.mark.parametrize(
    "url",
    ["redis://127.0.0.1:1/0", "ignite://127.0.0.1:1", "ignite://127.0.0.1:1,127.0.0.1:2"],
)
def test_unreachable_store_is_unavailable_quickly(url: str) -> None:
    started = time.monotonic()
    with pytest.raises(StalwartError) as err:
        open_store(url)
    assert time.monotonic() - started < 10
    assert err.value.kind is ErrorKind.UNAVAILABLE
    assert url in err.value.message
    assert "connection refused" in err.value.message


def test_unreachable_message_is_one_clear_line() -> None:
    with pytest.raises(StalwartError) as err:
        open_store("ignite://127.0.0.1:1?connect_timeout=1")
    assert str(err.value) == (
        "UNAVAILABLE: cannot reach store ignite://127.0.0.1:1: connection refused"
    )


def _own_redis(directory: Path) -> str:
    """The URL of a Redis server of the test's own (``stop_redis(directory)`` ends it)."""
    try:
        return start_redis(directory)
    except BackendUnavailable as e:
        skip_or_fail(f"no redis server: {e}")
        raise  # not reached: skip_or_fail skips or fails the test


def test_redis_server_gone_midway_is_unavailable(tmp_path: Path) -> None:
    url = _own_redis(tmp_path)
    try:
        store = open_store(url)
        store.kv_put("k", b"v")
    finally:
        stop_redis(tmp_path)
    with pytest.raises(StalwartError) as err:
        store.kv_get("k")
    assert err.value.kind is ErrorKind.UNAVAILABLE
    assert url in err.value.message


def test_ignite_caches_are_partitioned_with_one_backup(ignite_url: str) -> None:
    from pyignite.datatypes.cache_config import CacheMode
    from pyignite.datatypes.prop_codes import PROP_BACKUPS_NUMBER, PROP_CACHE_MODE

    with open_store(ignite_url) as store:
        for name in ("chunks", "manifests", "kv", "leases"):
            settings = store._caches[name].settings
            assert settings[PROP_CACHE_MODE] == CacheMode.PARTITIONED, name
            assert settings[PROP_BACKUPS_NUMBER] == 1, name


def test_ignite_chunks_survive_the_loss_of_one_node(tmp_path: Path) -> None:
    """Two nodes, backups=1: SIGKILL one and every chunk is still readable."""
    try:
        url = start_ignite(tmp_path, nodes=2)
    except BackendUnavailable as e:
        reason = f"no ignite cluster: {e}"
    else:
        reason = ""
    if reason:
        skip_or_fail(reason)
    try:
        with open_store(url) as store:
            chunks = {}
            for _ in range(16):
                data = os.urandom(32 << 10)
                chunks[chunk_hash(data)] = data
                store.put_chunk(chunk_hash(data), data)
            store.publish_manifest("job", "c1", b"manifest")
            victim = int((tmp_path / "node1" / "ignite.pid").read_text())
            os.kill(victim, signal.SIGKILL)
            for h, data in chunks.items():
                assert store.get_chunk(h) == data
            assert store.get_manifest("job", "c1") == b"manifest"
    finally:
        stop_ignite(tmp_path)


def test_reading_an_ignite_cluster_without_a_store_is_refused_and_creates_nothing(
    tmp_path: Path,
) -> None:
    """`ckpt list` opened the store as a paramserver does, which made the four caches on a
    cluster that had none: a read-only command left a store behind."""
    from pyignite import Client
    from typer.testing import CliRunner

    from stalwart.cli.main import app
    from stalwart.stores import parse_store_url

    try:
        url = start_ignite(tmp_path)
    except BackendUnavailable as e:
        skip_or_fail(f"no ignite cluster: {e}")
    try:
        result = CliRunner().invoke(app, ["ckpt", "list", "-j", "j", "--store-url", url])
        assert result.exit_code == 2, result.output
        assert result.output.strip() == (
            f"Error: no store at {parse_store_url(url).redacted}: the cluster lacks a store's caches "
            "(stalwart_chunks, stalwart_manifests, stalwart_kv, stalwart_leases)"
        )
        client = Client()
        with client.connect(list(parse_store_url(url).hosts)):
            assert client.get_cache_names() == []
        with open_store(url):  # a paramserver's open makes them, and then they are read
            pass
        listed = CliRunner().invoke(app, ["ckpt", "list", "-j", "j", "--store-url", url])
        assert listed.exit_code == 0, listed.output
    finally:
        stop_ignite(tmp_path)


def test_a_redis_at_its_maxmemory_answers_store_full(tmp_path: Path) -> None:
    url = _own_redis(tmp_path)
    try:
        store = open_store(url)
        store._r.config_set("maxmemory", 2 << 20)  # this test's own server
        data = os.urandom(4 << 20)
        with pytest.raises(StalwartError) as err:
            store.put_chunk(chunk_hash(data), data)
        assert err.value.kind is ErrorKind.STORE_FULL, err.value
        assert "is full" in err.value.message
    finally:
        stop_redis(tmp_path)


def test_a_file_store_out_of_room_answers_store_full(tmp_path: Path, monkeypatch) -> None:
    store = open_store(f"file://{tmp_path}/store")
    real_write = os.write

    def disk_full(fd, data):  # as a full tmpfs or disk answers
        raise OSError(28, os.strerror(28))

    monkeypatch.setattr(os, "write", disk_full)
    data = os.urandom(1 << 10)
    with pytest.raises(StalwartError) as err:
        store.put_chunk(chunk_hash(data), data)
    monkeypatch.setattr(os, "write", real_write)
    assert err.value.kind is ErrorKind.STORE_FULL, err.value
    assert not store.has_chunk(chunk_hash(data)) and store.list_chunks() == []
