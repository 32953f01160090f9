"""The Store contract, run against every backend on a real server.

Each test runs four times (shm, file, redis, ignite); see conftest.store_url.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from stalwart.errors import ErrorKind, StalwartError
from stalwart.stores import Lease, Store, chunk_hash, open_store
from tests.helpers import assert_eventually

# ------------------------------------------------------------------------ chunks


@pytest.mark.parametrize("size", [0, 1, 4 << 20])
def test_chunk_round_trip_is_bitwise(store: Store, size: int) -> None:
    data = os.urandom(size)
    h = chunk_hash(data)
    store.put_chunk(h, data)
    store.put_chunk(h, data)  # idempotent
    assert store.has_chunk(h)
    got = store.get_chunk(h)
    assert type(got) is bytes and got == data
    assert h in store.list_chunks()
    assert store.delete_chunk(h) is True
    assert store.delete_chunk(h) is False
    assert not store.has_chunk(h)


def test_chunk_with_wrong_hash_is_refused_and_not_stored(store: Store) -> None:
    data = os.urandom(1000)
    wrong = chunk_hash(data + b"x")
    with pytest.raises(StalwartError) as err:
        store.put_chunk(wrong, data)
    assert err.value.kind is ErrorKind.CHECKSUM_MISMATCH
    assert not store.has_chunk(wrong)


def test_prehashed_chunk_is_stored_from_a_view_without_a_second_check(store: Store) -> None:
    data = bytearray(os.urandom(64 * 1024 + 3))
    h = chunk_hash(data)
    store.put_chunk(h, memoryview(data), verified=True)
    data[0] ^= 0xFF  # the caller's buffer changes after the call: the stored chunk does not
    got = store.get_chunk(h)
    assert type(got) is bytes and chunk_hash(got) == h

    # the caller's word is taken, but readers still check: a wrong hash stores a
    # chunk that no verified read accepts
    wrong = chunk_hash(os.urandom(16))
    store.put_chunk(wrong, bytes(data), verified=True)
    with pytest.raises(StalwartError) as err:
        store.get_chunk(wrong)
    assert err.value.kind is ErrorKind.CHECKSUM_MISMATCH
    assert store.delete_chunk(wrong) and store.delete_chunk(h)


def test_unverified_view_is_copied_before_its_check(store: Store) -> None:
    data = os.urandom(4096)
    h = chunk_hash(data)
    store.put_chunk(h, memoryview(data))
    assert store.get_chunk(h) == data
    with pytest.raises(StalwartError) as err:
        store.put_chunk(chunk_hash(b"other"), memoryview(data))
    assert err.value.kind is ErrorKind.CHECKSUM_MISMATCH
    assert store.delete_chunk(h)


def test_missing_chunk_is_not_found(store: Store) -> None:
    h = chunk_hash(os.urandom(16))
    with pytest.raises(StalwartError) as err:
        store.get_chunk(h)
    assert err.value.kind is ErrorKind.NOT_FOUND
    assert h in err.value.message


@pytest.mark.parametrize("bad", ["", "abc", "G" * 64, "A" * 64, "../" + "a" * 61])
def test_bad_chunk_hash_is_invalid_argument(store: Store, bad: str) -> None:
    with pytest.raises(StalwartError) as err:
        store.get_chunk(bad)
    assert err.value.kind is ErrorKind.INVALID_ARGUMENT


# --------------------------------------------------------------------- manifests


def test_manifest_publish_list_get_delete(store: Store, uniq: str) -> None:
    job, other = f"{uniq}-job", f"{uniq}-other"
    assert store.list_manifests(job) == []
    store.publish_manifest(job, "step-200", b"m200")
    store.publish_manifest(job, "step-100", b"m100")
    store.publish_manifest(job, "step-100", b"m100")  # same bytes again: no-op
    assert store.list_manifests(job) == ["step-100", "step-200"]
    assert store.list_manifests(other) == []
    assert store.get_manifest(job, "step-100") == b"m100"

    with pytest.raises(StalwartError) as err:
        store.publish_manifest(job, "step-100", b"different")
    assert err.value.kind is ErrorKind.ALREADY_EXISTS
    assert store.get_manifest(job, "step-100") == b"m100"

    jobs = store.list_manifest_jobs()  # the store may hold other tests' jobs too
    assert job in jobs and other not in jobs and jobs == sorted(jobs)

    assert store.delete_manifest(job, "step-100") is True
    assert store.delete_manifest(job, "step-100") is False
    assert store.list_manifests(job) == ["step-200"]
    assert store.delete_manifest(job, "step-200") is True
    assert job not in store.list_manifest_jobs()  # no manifest left: not a job of it
    store.publish_manifest(job, "step-200", b"m200")
    with pytest.raises(StalwartError) as err:
        store.get_manifest(job, "step-100")
    assert err.value.kind is ErrorKind.NOT_FOUND


@pytest.mark.parametrize("job", ["", "../etc", "a/b", "-x", "a b"])
def test_bad_job_id_is_invalid_argument(store: Store, job: str) -> None:
    with pytest.raises(StalwartError) as err:
        store.publish_manifest(job, "c1", b"m")
    assert err.value.kind is ErrorKind.INVALID_ARGUMENT


_WRITER = textwrap.dedent(
    """
    import os, sys, time
    from stalwart.stores import chunk_hash, open_store
    store = open_store(sys.argv[1])
    for i in range(3):
        data = os.urandom(256 << 10)
        store.put_chunk(chunk_hash(data), data)
        print(chunk_hash(data), flush=True)
    print("chunks-written", flush=True)
    time.sleep(600)  # killed here, before publish_manifest
    store.publish_manifest(sys.argv[2], "ckpt-1", b"never")
    """
)


def test_writer_killed_before_publish_leaves_no_visible_checkpoint(
    store: Store, store_url: str, uniq: str
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, store_url, uniq], stdout=subprocess.PIPE, text=True
    )
    try:
        lines = [proc.stdout.readline().strip() for _ in range(4)]
        assert lines[-1] == "chunks-written", lines
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert all(store.has_chunk(h) for h in lines[:3])  # the chunks are there...
    assert store.list_manifests(uniq) == []  # ...but no checkpoint is
    with pytest.raises(StalwartError) as err:
        store.get_manifest(uniq, "ckpt-1")
    assert err.value.kind is ErrorKind.NOT_FOUND


@pytest.mark.parametrize("backend", ["shm", "file"])
def test_half_written_manifest_file_is_invisible(
    request: pytest.FixtureRequest, backend: str, uniq: str
) -> None:
    """A temp file left by a writer killed mid-publish is not a manifest.

    (Redis and Ignite publish with one command, so there is no half state to leave.)
    """
    with open_store(request.getfixturevalue(f"{backend}_url")) as store:
        directory = os.path.join(store.root, "manifests", uniq)
        os.makedirs(directory)
        with open(os.path.join(directory, ".tmp-deadbeef"), "wb") as f:
            f.write(b"half a manif")
        assert store.list_manifests(uniq) == []
        store.publish_manifest(uniq, "c1", b"whole")
        assert store.list_manifests(uniq) == ["c1"]


# ---------------------------------------------------------------------------- kv


def test_kv_cas_semantics(store: Store, uniq: str) -> None:
    k = f"{uniq}/state"
    assert store.kv_get(k) is None
    assert store.kv_cas(k, b"x", b"y") is False  # expected a value, there is none
    assert store.kv_cas(k, None, b"v1") is True  # create if absent
    assert store.kv_cas(k, None, b"v1b") is False  # no longer absent
    assert store.kv_get(k) == b"v1"
    assert store.kv_cas(k, b"wrong", b"v2") is False
    assert store.kv_get(k) == b"v1"
    assert store.kv_cas(k, b"v1", b"v2") is True
    assert store.kv_get(k) == b"v2"
    assert store.kv_cas(k, b"v1", None) is False  # delete needs the current value
    assert store.kv_cas(k, b"v2", None) is True
    assert store.kv_get(k) is None
    assert store.kv_cas(k, None, None) is True  # "absent and stays absent"


def test_kv_put_list_delete(store: Store, uniq: str) -> None:
    store.kv_put(f"{uniq}/jobs/a", b"A")
    store.kv_put(f"{uniq}/jobs/b", b"B")
    store.kv_put(f"{uniq}/nodes/n1", b"")
    store.kv_put(f"{uniq}/jobs/a", b"A2")
    assert store.kv_list(f"{uniq}/jobs/") == {f"{uniq}/jobs/a": b"A2", f"{uniq}/jobs/b": b"B"}
    assert store.kv_list(f"{uniq}/nodes/") == {f"{uniq}/nodes/n1": b""}
    assert len(store.kv_list(uniq)) == 3
    assert store.kv_delete(f"{uniq}/jobs/a") is True
    assert store.kv_delete(f"{uniq}/jobs/a") is False
    assert list(store.kv_list(f"{uniq}/jobs/")) == [f"{uniq}/jobs/b"]


def test_kv_cas_counter_under_contention(store_url: str, uniq: str) -> None:
    """Four clients increment one counter with CAS; no increment is lost."""
    key, per_thread, threads = f"{uniq}/counter", 15, 4
    errors: list[BaseException] = []

    def bump() -> None:
        try:
            with open_store(store_url) as s:
                for _ in range(per_thread):
                    while True:
                        cur = s.kv_get(key)
                        new = str(int(cur or b"0") + 1).encode()
                        if s.kv_cas(key, cur, new):
                            break
        except BaseException as e:  # surfaced below
            errors.append(e)

    workers = [threading.Thread(target=bump) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    assert not errors, errors
    with open_store(store_url) as s:
        assert s.kv_get(key) == str(per_thread * threads).encode()


# ------------------------------------------------------------------------ leases


def test_lease_is_exclusive_and_fenced(store_url: str, uniq: str) -> None:
    with open_store(store_url) as a, open_store(store_url) as b:
        la = a.acquire_lease(uniq, "holder-a", 30)
        assert la is not None and la.holder == "holder-a" and la.token >= 1
        assert b.acquire_lease(uniq, "holder-b", 30) is None  # held
        assert a.acquire_lease(uniq, "holder-a", 30) is None  # held, even by itself
        seen = b.get_lease(uniq)
        assert seen is not None and (seen.holder, seen.token) == ("holder-a", la.token)

        # A non-holder cannot renew or release, even with the right token.
        impostor = Lease(uniq, "holder-b", la.token, la.expires_at, la.ttl_s)
        assert b.renew_lease(impostor) is False
        assert b.release_lease(impostor) is False
        assert a.renew_lease(la) is True

        assert a.release_lease(la) is True
        assert a.release_lease(la) is False
        assert b.get_lease(uniq) is None
        lb = b.acquire_lease(uniq, "holder-b", 30)
        assert lb is not None and lb.token > la.token
        assert a.renew_lease(la) is False  # the old holder is fenced out
        assert b.release_lease(lb) is True


def test_expired_lease_goes_to_next_holder_with_higher_token(store_url: str, uniq: str) -> None:
    with open_store(store_url) as a, open_store(store_url) as b:
        la = a.acquire_lease(uniq, "holder-a", 0.3)
        assert la is not None
        assert b.acquire_lease(uniq, "holder-b", 5) is None
        lb = assert_eventually(lambda: b.acquire_lease(uniq, "holder-b", 5) or False, timeout=5)
        assert lb.holder == "holder-b" and lb.token > la.token
        assert a.renew_lease(la) is False
        assert a.release_lease(la) is False
        current = a.get_lease(uniq)
        assert current is not None and current.holder == "holder-b"
        assert b.release_lease(lb) is True


def test_only_one_of_many_racing_acquirers_wins(store_url: str, uniq: str) -> None:
    stores = [open_store(store_url) for _ in range(4)]
    won: list[Lease] = []
    barrier = threading.Barrier(len(stores))

    def race(i: int) -> None:
        barrier.wait()
        lease = stores[i].acquire_lease(uniq, f"h{i}", 30)
        if lease is not None:
            won.append(lease)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    try:
        assert len(won) == 1, won
    finally:
        for s in stores:
            s.close()


def test_renewed_lease_outlives_its_first_ttl(store_url: str, uniq: str) -> None:
    with open_store(store_url) as a, open_store(store_url) as b:
        la = a.acquire_lease(uniq, "holder-a", 1.0)
        assert la is not None
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            assert a.renew_lease(la) is True
            assert b.acquire_lease(uniq, "holder-b", 1.0) is None
            time.sleep(0.2)
        assert a.release_lease(la) is True
