"""Which listening sockets the compose stack's containers hold, and whether all are loopback.

The variant runs every container in the host's network namespace, so a service
that bound a wildcard or an external address would face the machine's network.
``ss -Hltunp`` names each socket's owner process; a process belongs to a
container when its cgroup path names the container's id. Pure parsing here, so
the rules are tested on made-up lines (tests/deploy/test_compose_sockets.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

_PID = re.compile(r"pid=(\d+)")


@dataclass(frozen=True)
class Listener:
    proto: str  # tcp | udp
    address: str  # host part of the local address, brackets stripped
    port: int
    pids: tuple[int, ...]


def parse_ss(text: str) -> list[Listener]:
    """Lines of ``ss -H -l -t -u -n -p``: proto, state, recv-q, send-q, local, peer, users."""
    out = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 5:
            continue
        host, _, port = fields[4].rpartition(":")
        if not port.isdigit():
            continue
        host = host.strip("[]").split("%", 1)[0]  # [::1], 127.0.0.1%lo
        pids = tuple(int(p) for p in _PID.findall(" ".join(fields[6:])))
        out.append(Listener(fields[0], host, int(port), pids))
    return out


def is_loopback(address: str) -> bool:
    return address.startswith(("127.", "::ffff:127.")) or address == "::1"


def container_of(cgroup_text: str, container_ids: Iterable[str]) -> str | None:
    """The container id (of those given) that a /proc/PID/cgroup text names, if any."""
    for cid in container_ids:
        if cid and cid in cgroup_text:
            return cid
    return None


def stack_listeners(
    listeners: Iterable[Listener], container_ids: Iterable[str], cgroup: Callable[[int], str]
) -> list[tuple[Listener, str]]:
    """(socket, container id) for every socket a process of one of the containers holds.

    ``cgroup(pid)`` returns /proc/PID/cgroup's text ("" for a process gone meanwhile)."""
    ids = list(container_ids)
    found = []
    for sock in listeners:
        for pid in sock.pids:
            cid = container_of(cgroup(pid), ids)
            if cid is not None:
                found.append((sock, cid))
                break
    return found
