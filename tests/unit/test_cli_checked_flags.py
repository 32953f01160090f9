"""Flags naming a file to write or an address to dial are checked before any work: a
file that is a folder, empty or in no folder, and an address that is not host:port, are
one `Error:` line and exit 2. `job export -o DIR` used to fetch the model and then end
in a 50-line safetensors traceback (exit 1)."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from typer.testing import CliRunner

from stalwart.cli.main import app as stalwart

UNREACHABLE = ("-c", "127.0.0.1:1", "--timeout", "0.1")  # never dialled: refused before


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["job", "export", "j", "-o", "{tmp}"], "-o/--file '{tmp}' is a folder"),
        (["job", "export", "j", "-o", ""], "-o/--file '.' is a folder"),
        (["job", "export", "j", "-o", "{tmp}/no/such/x.st"], "no folder '{tmp}/no/such'"),
        (["job", "export", "j", "-o", "{tmp}/w.st", "--optimizer-state", "{tmp}"],
         "--optimizer-state '{tmp}' is a folder"),
        (["sim", "ettr", "--gpus", "8", "--days", "1", "--seeds", "1", "--no-anchors",
          "--html", "{tmp}"], "--html '{tmp}' is a folder"),
    ],
)  # fmt: skip
def test_a_file_that_cannot_be_written_is_refused_first(tmp_path, args, says):
    argv = [a.format(tmp=tmp_path) for a in args]
    if argv[0] == "job":
        argv += UNREACHABLE
    result = CliRunner().invoke(stalwart, argv)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), lines
    assert says.format(tmp=tmp_path) in lines[0]
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize(
    "address", ["[::1]:x", ":", "host:99999", "a b:1", "http://127.0.0.1:1", "127.0.0.1:-1", "h"]
)
@pytest.mark.parametrize(
    ("command", "flag"), [(["jobs", "-c"], "--coordinator"), (["ps", "status", "-a"], "--address")]
)
def test_a_malformed_address_is_refused_at_once(address, command, flag):
    """It used to be dialled until --timeout and reported as an unreachable cluster."""
    result = CliRunner().invoke(stalwart, [*command, address])
    assert result.exit_code == 2, result.output
    want = f"Error: {flag} {address!r} is not host:port (a port 1-65535; [v6 address]:port)"
    assert result.stderr.strip() == want


def test_an_address_of_another_service_is_named_as_such():
    """A coordinator's call at a server that does not serve it (a paramserver's address)
    was exit 4 with gRPC's bare 'Method not found!'."""

    def invoke(port: int):
        return CliRunner().invoke(stalwart, ["jobs", "-c", f"127.0.0.1:{port}"])

    async def ask():
        server = grpc.aio.server()  # serves no method at all
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            return await asyncio.to_thread(invoke, port)
        finally:
            await server.stop(None)

    result = asyncio.run(ask())
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("Error: the address answers but does not serve this call (")


def test_a_table_shows_control_characters_and_markup_as_written(capsys):
    """A job's reason is any client's text: an ESC sequence in it used to reach the
    terminal, and rich markup in it was rendered."""
    from stalwart.cli.output import emit_table

    emit_table("jobs", ["job", "reason"], [("j1", "r\x1b[31mRED [bold]x[/bold]\nnext")])
    shown = capsys.readouterr().out
    assert "\x1b" not in shown and "r\\x1b[31mRED [bold]x[/bold]\\nnext" in shown


def test_a_flag_typed_now_beats_an_exported_variable_of_a_higher_rank(tmp_path):
    """An exported STALWART_COORDINATOR used to override --run-dir typed on the command
    line, and STALWART_RUN_DIR a typed --runs-root (down stopped the other cluster)."""
    typed, exported = tmp_path / "typed", tmp_path / "exported"
    env = {"STALWART_COORDINATOR": "foo:1"}
    result = CliRunner().invoke(stalwart, ["status", "--run-dir", str(typed)], env=env)
    assert result.exit_code == 3 and f"no cluster state in {typed}" in result.stderr
    result = CliRunner().invoke(stalwart, ["down", "--runs-root", str(typed)],
                                env={"STALWART_RUN_DIR": str(exported)})  # fmt: skip
    assert result.exit_code == 2 and str(typed) in result.stderr, result.stderr
    assert str(exported) not in result.stderr
