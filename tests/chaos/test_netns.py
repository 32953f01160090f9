"""The test network itself (netns.py): its hosts reach each other and the test process,
a cut link and a partition stop exactly the traffic they claim to, and leftovers of a
dead run are removed."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from tests.chaos import netns
from tests.helpers import assert_eventually

pytestmark = pytest.mark.timeout(120)

#: Above the kernel's largest pid (4194304): never a live process.
DEAD_PID = 4_194_399
PORT = 7411
_SERVE = (
    "import socket, sys\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    f"s.bind((sys.argv[1], {PORT})); s.listen(16); print('up', flush=True)\n"
    "while True: s.accept()[0].close()\n"
)
_DIAL = (
    "import socket, sys\n"
    f"try: socket.create_connection((sys.argv[1], {PORT}), timeout=2).close(); print('ok')\n"
    "except OSError as e: print('fail', type(e).__name__)\n"
)


@pytest.fixture
def net():
    netns.require()
    test_net = netns.TestNet.create(["a", "b"])
    server = subprocess.Popen(
        ["ip", "netns", "exec", test_net.hosts["a"].netns, sys.executable, "-c", _SERVE,
         test_net.hosts["a"].ip], stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout.readline().strip() == "up"
        yield test_net
    finally:
        server.kill()
        server.wait()
        test_net.remove()


def _from_root(ip: str) -> str:
    try:
        socket.create_connection((ip, PORT), timeout=2).close()
        return "ok"
    except OSError as exc:
        return f"fail {type(exc).__name__}"


def _from_host(net: netns.TestNet, host: str, ip: str) -> str:
    cmd = ["ip", "netns", "exec", net.hosts[host].netns, sys.executable, "-c", _DIAL, ip]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()


def test_hosts_have_own_addresses_and_reach_each_other(net: netns.TestNet) -> None:
    a, b = net.hosts["a"], net.hosts["b"]
    assert a.ip != b.ip and a.ip.startswith(f"{netns.SUBNET}.{net.subnet}.")
    assert _from_root(a.ip) == "ok"
    assert _from_host(net, "b", a.ip) == "ok"
    assert _from_host(net, "b", "127.0.0.1") != "ok"  # b's loopback is its own


def test_cut_drops_silently_and_restore_reconnects(net: netns.TestNet) -> None:
    ip = net.hosts["a"].ip
    net.cut("a")
    for outcome in (_from_root(ip), _from_host(net, "b", ip)):
        # dropped (a timeout, or no ARP answer), never refused: nobody is told
        assert outcome in ("fail TimeoutError", "fail OSError"), outcome
    net.restore("a")
    # a neighbour entry that failed during the cut is retried after a few seconds
    assert_eventually(lambda: _from_root(ip) == "ok", timeout=60, interval=0.5)
    assert_eventually(lambda: _from_host(net, "b", ip) == "ok", timeout=60, interval=0.5)


def test_partition_cuts_the_pair_only(net: netns.TestNet) -> None:
    ip = net.hosts["a"].ip
    net.partition("a", away_from=["b"])
    assert _from_host(net, "b", ip).startswith("fail")
    assert _from_root(ip) == "ok"  # a still reaches everyone else
    net.heal("a")
    assert_eventually(lambda: _from_host(net, "b", ip) == "ok", timeout=60, interval=0.5)


def test_leftovers_of_a_dead_run_are_removed_and_live_ones_kept(net: netns.TestNet) -> None:
    # named after a pid that cannot be alive; the tail keeps two runs of this test apart
    stale, bridge = f"{netns.PREFIX}-{DEAD_PID}-{os.getpid()}", f"stwbr{DEAD_PID}"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    subprocess.run(["ip", "link", "add", bridge, "type", "bridge"], capture_output=True)
    try:
        removed = netns.remove_stale()
    finally:
        subprocess.run(["ip", "netns", "del", stale], capture_output=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)
    assert stale in removed
    live = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert stale not in live and f" {bridge}:" not in links
    assert all(h.netns in live for h in net.hosts.values())
    assert f" {net.bridge}:" in links
