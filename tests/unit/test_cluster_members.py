"""Which processes a state file's members still are: known by their start time, so a
service forked from the preloading server (whose command line is that server's) is
stopped by `stalwart down` too, and a reused pid is not."""

from __future__ import annotations

import subprocess
import sys

from stalwart import cluster
from stalwart.procs import process_start_ticks


def _sleeper() -> subprocess.Popen:
    # its own session, as the launcher gives every service (stop_members signals the group)
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                            start_new_session=True)  # fmt: skip


def test_a_member_is_known_by_its_start_time_not_its_command_line():
    proc = _sleeper()
    try:
        ticks = process_start_ticks(proc.pid)
        assert ticks
        member = cluster.Member("coord-0", "coordinator", "127.0.0.1:1", proc.pid, "x.log",
                                start_ticks=ticks)  # fmt: skip
        assert cluster._is_ours(member)  # its command line names no service
        assert not cluster._is_ours(cluster.Member("coord-0", "coordinator", "127.0.0.1:1",
                                                   proc.pid, "x.log", start_ticks=ticks + 1))  # fmt: skip
        cluster.stop_members([member], timeout_s=30)
        assert proc.wait(timeout=30) != 0  # SIGTERM ended it
        assert not cluster._is_ours(member)
    finally:
        proc.kill()
        proc.wait()


def test_state_files_without_start_times_fall_back_to_the_command_line():
    proc = _sleeper()
    try:
        member = cluster.Member("coord-0", "coordinator", "127.0.0.1:1", proc.pid, "x.log")
        assert not cluster._is_ours(member)  # not a coordinator's command line
    finally:
        proc.kill()
        proc.wait()
