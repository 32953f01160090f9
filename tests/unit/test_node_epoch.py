"""What a node does with a refused epoch (``leaders_epoch``), and each local cluster's
own store directory (``reserve_store_dir``)."""

from __future__ import annotations

import grpc
import pytest

from stalwart.client.coordinator import leaders_epoch
from stalwart.cluster import reserve_store_dir
from stalwart.errors import ErrorKind, RpcError


def _err(kind: ErrorKind, **metadata: str) -> RpcError:
    code, reason = kind.value
    return RpcError(code, "refused", reason, metadata)


@pytest.mark.parametrize(
    ("name", "held", "err", "want"),
    [
        ("leader-lower-taken", 2, _err(ErrorKind.UNKNOWN_EPOCH, epoch="1"), 1),
        ("far-above-taken", 1001, _err(ErrorKind.UNKNOWN_EPOCH, epoch="3"), 3),
        ("equal-kept", 3, _err(ErrorKind.UNKNOWN_EPOCH, epoch="3"), None),
        ("higher-never-by-refusal", 3, _err(ErrorKind.UNKNOWN_EPOCH, epoch="5"), None),
        ("zero-kept", 3, _err(ErrorKind.UNKNOWN_EPOCH, epoch="0"), None),
        ("missing-kept", 3, _err(ErrorKind.UNKNOWN_EPOCH), None),
        ("garbage-kept", 3, _err(ErrorKind.UNKNOWN_EPOCH, epoch="two"), None),
        ("not-leader-kept", 3, _err(ErrorKind.NOT_LEADER, leader="x:1", epoch="1"), None),
        ("unknown-node-kept", 3, _err(ErrorKind.UNKNOWN_NODE, epoch="1"), None),
    ],
)
def test_leaders_epoch(name: str, held: int, err: RpcError, want: int | None) -> None:
    assert leaders_epoch(held, err) == want, name


def test_unavailable_keeps_the_epoch() -> None:
    err = RpcError(grpc.StatusCode.UNAVAILABLE, "down", "", {"epoch": "1"})
    assert leaders_epoch(4, err) is None


def test_two_runs_started_in_one_second_get_their_own_store(tmp_path) -> None:
    first = reserve_store_dir("20261202-072641", tmp_path)
    second = reserve_store_dir("20261202-072641", tmp_path)
    third = reserve_store_dir("20261202-072641", tmp_path)
    assert first == tmp_path / "20261202-072641"
    assert second == tmp_path / "20261202-072641-1"
    assert third == tmp_path / "20261202-072641-2"
    assert all(p.is_dir() for p in (first, second, third))
