"""scripts/compose/sockets.py: which sockets the compose stack holds, and the loopback rule.

make compose-test runs every container in the host's network namespace and fails
when one of them listens beyond 127.0.0.0/8; these tests pin the parsing it relies on."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.deploy.project import ROOT

SS = """\
tcp   LISTEN 0      4096       127.0.0.1:27100      0.0.0.0:*    users:(("python",pid=101,fd=7))
tcp   LISTEN 0      128          0.0.0.0:2024       0.0.0.0:*
tcp   LISTEN 0      4096               *:41789            *:*    users:(("java",pid=202,fd=11),("java",pid=203,fd=11))
tcp   LISTEN 0      511            [::1]:6379          [::]:*    users:(("redis-server",pid=303,fd=6))
udp   UNCONN 0      0      127.0.0.1%lo:323         0.0.0.0:*    users:(("chronyd",pid=404,fd=5))
tcp   LISTEN 0      50     [::ffff:127.0.0.1]:47500       *:*    users:(("java",pid=203,fd=40))
"""


@pytest.fixture(scope="module")
def sockets():
    name = "compose_sockets"  # dataclasses look their module up in sys.modules
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts/compose/sockets.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[name]


def test_parse_ss_reads_address_port_and_every_owner(sockets) -> None:
    got = [(s.proto, s.address, s.port, s.pids) for s in sockets.parse_ss(SS)]
    assert got == [
        ("tcp", "127.0.0.1", 27100, (101,)),
        ("tcp", "0.0.0.0", 2024, ()),
        ("tcp", "*", 41789, (202, 203)),
        ("tcp", "::1", 6379, (303,)),
        ("udp", "127.0.0.1", 323, (404,)),
        ("tcp", "::ffff:127.0.0.1", 47500, (203,)),
    ]


@pytest.mark.parametrize(
    ("address", "loopback"),
    [("127.0.0.1", True), ("127.5.0.9", True), ("::1", True), ("::ffff:127.0.0.1", True),
     ("0.0.0.0", False), ("*", False), ("::", False), ("10.0.0.4", False),
     ("::ffff:10.0.0.4", False), ("1270.0.0.1", False)],
)  # fmt: skip
def test_is_loopback(sockets, address: str, loopback: bool) -> None:
    assert sockets.is_loopback(address) is loopback


def test_stack_listeners_keeps_only_the_containers_processes(sockets) -> None:
    cgroups = {
        101: "12:pids:/docker/aaa111\n1:name=systemd:/docker/aaa111\n",
        203: "12:pids:/docker/bbb222\n",
        303: "12:pids:/user.slice\n",
        404: "",  # gone meanwhile
    }
    found = sockets.stack_listeners(
        sockets.parse_ss(SS), ["aaa111", "bbb222"], lambda pid: cgroups.get(pid, "")
    )
    assert [(s.port, cid) for s, cid in found] == [
        (27100, "aaa111"),
        (41789, "bbb222"),  # the second owner is the container's
        (47500, "bbb222"),
    ]
    wide = [s.port for s, _ in found if not sockets.is_loopback(s.address)]
    assert wide == [41789]
