"""The memory this process can still take, read from the kernel (no torch, no psutil).

Paramservers check a new job's model against it before allocating a byte of it,
and trainers before building it: past it, the kernel's OOM killer ends a process,
and with a paramserver every job it holds.
"""

from __future__ import annotations

import sys
from pathlib import Path


def available_bytes(proc: Path = Path("/proc"), cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """MemAvailable, or less where a cgroup (v2) limit leaves less. The cgroup's use
    is counted as the kubelet counts its working set: without the inactive page cache,
    which the kernel drops before it kills anything."""
    try:
        available = _meminfo_available(proc / "meminfo")
    except (OSError, ValueError):  # not Linux: nothing to go by, so nothing is refused
        return sys.maxsize
    limit, used = _read_int(cgroup / "memory.max"), _read_int(cgroup / "memory.current")
    if limit is not None and used is not None:
        used -= _stat(cgroup / "memory.stat", "inactive_file")
        available = min(available, limit - used)
    return available


def total_bytes(proc: Path = Path("/proc"), cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """MemTotal, or the cgroup (v2) limit where it is lower; sys.maxsize off Linux."""
    try:
        total = _meminfo_field(proc / "meminfo", "MemTotal")
    except (OSError, ValueError):
        return sys.maxsize
    limit = _read_int(cgroup / "memory.max")
    return min(total, limit) if limit is not None else total


def _stat(path: Path, key: str) -> int:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return 0
    for line in lines:
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


def _meminfo_available(path: Path) -> int:
    return _meminfo_field(path, "MemAvailable")


def _meminfo_field(path: Path, name: str) -> int:
    for line in path.read_text().splitlines():
        if line.startswith(f"{name}:"):
            return int(line.split()[1]) * 1024  # kB
    raise OSError(f"no {name} in {path}")


def _read_int(path: Path) -> int | None:
    """An integer file's value; None when it is absent or says "max" (no limit)."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
