"""Test hosts on a private network: one network namespace per service.

Each host is a namespace (``ip netns``) with one veth pair: ``eth0`` inside, with an
address of its own in ``10.213.N.0/24``, and the other end on a bridge in the root
namespace, which holds ``10.213.N.1`` so that the test process dials every host.
Nothing is routed beyond that subnet: the hosts reach each other and the test, and
nothing else.

Faults are made with what a bare kernel offers (no netem or iptables needed):

- ``cut``/``restore``: the bridge end of a host's link down and up again, so its
  packets are dropped in silence (a pulled cable, not a refused connection);
- ``partition``/``heal``: blackhole routes inside one host towards some others. TCP
  needs both directions, so the pair is cut both ways while each keeps every other
  peer: an asymmetric, non-transitive partition.

Names carry the creating process's pid (``stwnc-<pid>-<host>``, links ``stwbr<pid>``
and ``stwv<pid>x<i>``), so a run that died without cleaning up is recognised and its
leftovers removed by the next one (:func:`remove_stale`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field

import pytest

from stalwart.cluster import Host

PREFIX = "stwnc"
SUBNET = "10.213"
FIRST_HOST = 10  # 10.213.N.10 is the first host; .1 is the bridge (the test process)
_NETNS = re.compile(rf"^{PREFIX}-(\d+)-\S+")
_LINK = re.compile(r"^\d+:\s+(stw(?:br|v)(\d+)(?:x\d+)?)[@:]")


class NetError(RuntimeError):
    """An ``ip`` command failed; the message holds the command and its stderr."""


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2) on PATH"
    probe = f"{PREFIX}-{os.getpid()}-probe"
    try:
        _ip("netns", "add", probe)
    except NetError as exc:
        return f"`ip netns add` does not work here: {exc}"
    _ip("netns", "del", probe)
    return None


def require() -> None:
    """Skip the calling test, with the reason, when namespaces cannot be made here;
    fail it instead under STALWART_REQUIRE_BACKENDS=1 (``make test``, CI)."""
    reason = unavailable()
    if reason is None:
        return
    if os.environ.get("STALWART_REQUIRE_BACKENDS") == "1":
        pytest.fail(f"network namespaces needed: {reason}")
    pytest.skip(reason)


@dataclass
class TestNet:
    """The namespaces, links and routes one test made; :meth:`remove` undoes all of it."""

    subnet: int
    tag: str = field(default_factory=lambda: str(os.getpid()))
    hosts: dict[str, Host] = field(default_factory=dict)
    _links: dict[str, str] = field(default_factory=dict)  # host name -> bridge end
    _blocked: dict[str, set[str]] = field(default_factory=dict)  # host -> ips it cannot reach

    @property
    def bridge(self) -> str:
        return f"stwbr{self.tag}"

    @property
    def gateway(self) -> str:
        return f"{SUBNET}.{self.subnet}.1"

    @classmethod
    def create(cls, names: list[str]) -> TestNet:
        """A bridge and one host per name; on any failure, what was made is removed."""
        remove_stale()
        net = cls(subnet=_free_subnet())
        try:
            _ip("link", "add", net.bridge, "type", "bridge")
            _ip("addr", "add", f"{net.gateway}/24", "dev", net.bridge)
            _ip("link", "set", net.bridge, "up")
            for name in names:
                net._add_host(name)
        except BaseException:
            net.remove()
            raise
        return net

    def _add_host(self, name: str) -> None:
        index = len(self.hosts)
        netns = f"{PREFIX}-{self.tag}-{name}"
        outside, ip = f"stwv{self.tag}x{index}", f"{SUBNET}.{self.subnet}.{FIRST_HOST + index}"
        _ip("netns", "add", netns)
        self.hosts[name] = Host(netns, ip)
        _ip("link", "add", outside, "type", "veth", "peer", "name", "eth0", "netns", netns)
        self._links[name] = outside
        _ip("link", "set", outside, "master", self.bridge, "up")
        _ip("-n", netns, "addr", "add", f"{ip}/24", "dev", "eth0")
        _ip("-n", netns, "link", "set", "eth0", "up")
        _ip("-n", netns, "link", "set", "lo", "up")  # each service's metrics listen there

    # --- faults -----------------------------------------------------------------------

    def cut(self, name: str) -> None:
        """Take the host off the network: its packets are dropped, nobody is told."""
        _ip("link", "set", self._links[name], "down")

    def restore(self, name: str) -> None:
        _ip("link", "set", self._links[name], "up")

    def partition(self, name: str, away_from: list[str]) -> None:
        """``name`` and each of ``away_from`` no longer reach each other (both ways:
        the route sits on ``name``'s side, and TCP needs replies)."""
        blocked = self._blocked.setdefault(name, set())
        for other in away_from:
            ip = self.hosts[other].ip
            if ip not in blocked:
                _ip("-n", self.hosts[name].netns, "route", "add", "blackhole", f"{ip}/32")
                blocked.add(ip)

    def heal(self, name: str) -> None:
        for ip in sorted(self._blocked.pop(name, set())):
            _ip("-n", self.hosts[name].netns, "route", "del", "blackhole", f"{ip}/32")

    # --- clean-up ---------------------------------------------------------------------

    def remove(self) -> None:
        """Delete every namespace and the bridge (each veth pair goes with its namespace).
        Best effort: one failure does not keep the rest in place."""
        for host in self.hosts.values():
            _ip_quiet("netns", "del", host.netns)
        for outside in self._links.values():
            _ip_quiet("link", "del", outside)  # gone already unless the namespace lingers
        _ip_quiet("link", "del", self.bridge)
        self.hosts.clear()
        self._links.clear()


def remove_stale() -> list[str]:
    """Remove namespaces and links left by test processes that no longer exist."""
    removed = []
    for line in _ip("netns", "list").splitlines():
        match = _NETNS.match(line)
        if match and not _alive(int(match.group(1))):
            name = line.split()[0]
            _ip_quiet("netns", "del", name)
            removed.append(name)
    for line in _ip("-o", "link", "show").splitlines():
        match = _LINK.match(line)
        if match and not _alive(int(match.group(2))):
            _ip_quiet("link", "del", match.group(1))
            removed.append(match.group(1))
    return removed


def _free_subnet() -> int:
    """A /24 of 10.213.0.0/16 that no interface of this machine uses yet."""
    used = _ip("-o", "-4", "addr", "show")
    start = os.getpid() % 250
    for offset in range(250):
        n = (start + offset) % 250 + 1
        if f" {SUBNET}.{n}." not in used:
            return n
    raise NetError(f"no free /24 left in {SUBNET}.0.0/16")


def _alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def _ip(*args: str) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise NetError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def _ip_quiet(*args: str) -> None:
    try:
        _ip(*args)
    except NetError:
        pass
