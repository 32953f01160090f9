"""A command that cannot reach a leader says so on a terminal after a second, instead
of looking hung for all of --timeout; for scripts stderr keeps only the error."""

import io
import os
import pty
import socket
import subprocess
import sys
from pathlib import Path

import grpc

from stalwart.cli.target import StillTrying
from stalwart.errors import RpcError

ROOT = Path(__file__).resolve().parents[2]
REFUSED = RpcError(grpc.StatusCode.UNAVAILABLE, "Connection refused\nmore detail")


def test_said_once_and_only_after_the_first_second(monkeypatch):
    out = io.StringIO()
    notice = StillTrying(["127.0.0.1:7000", "127.0.0.1:7001"], 15.0, stream=out)
    notice(REFUSED)
    assert out.getvalue() == ""  # a leader that answers on the second try says nothing
    monkeypatch.setattr(StillTrying, "NOTICE_AFTER_S", 0.0)
    notice(REFUSED)
    notice(REFUSED)
    assert out.getvalue() == (
        "no leader at 127.0.0.1:7000,127.0.0.1:7001 yet (Connection refused); "
        "trying for up to 15 s (--timeout)…\n"
    )


def _closed_port():
    """A bound, never listening socket: connections to it are refused, and no other
    process can take the port while it is held."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


def _on_a_terminal(*args: str) -> tuple[str, int]:
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover (the child)
        os.chdir(ROOT)
        os.execv(sys.executable, [sys.executable, *args])
    out = b""
    while True:
        try:
            data = os.read(fd, 4096)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        out += data
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return out.decode(), os.waitstatus_to_exitcode(status)


def test_a_terminal_is_told_and_a_script_gets_one_line():
    with _closed_port() as sock:
        address = f"127.0.0.1:{sock.getsockname()[1]}"
        args = ("-m", "stalwart.cli.main", "jobs", "-c", address, "--timeout", "2.5")
        shown, rc = _on_a_terminal(*args)
        lines = shown.strip().splitlines()
        assert rc == 3, shown
        assert lines[0].startswith(f"no leader at {address} yet (") and "(--timeout)" in lines[0]
        assert lines[-1].startswith("Error: cannot reach the cluster: ")
        piped = subprocess.run([sys.executable, *args], capture_output=True, text=True,
                               cwd=ROOT, timeout=60)  # fmt: skip
        assert piped.returncode == 3
        assert len(piped.stderr.strip().splitlines()) == 1, piped.stderr
