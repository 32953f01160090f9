"""Option groups: a dataclass of flags taken as one parameter, listed in its place in --help."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from stalwart.api import coordinator
from stalwart.cli.main import app as stalwart
from stalwart.cli.main import main
from stalwart.cli.target import FROM_FLAGS, LONG_TIMEOUT_S, Target, option_groups
from stalwart.client.coordinator import CoordinatorClient


@pytest.fixture(autouse=True)
def _sigterm_kept():
    """main() sets a SIGTERM handler; the test process keeps its own."""
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


@dataclass(frozen=True)
class _Where:
    job: str = typer.Option("", "--job")
    cluster: Target = FROM_FLAGS


def _app(seen: list) -> typer.Typer:
    app = typer.Typer()

    @app.command()
    @option_groups
    def show(name: str, where: _Where = FROM_FLAGS, last: int = typer.Option(0)) -> None:
        seen.append((name, where, last))

    return app


def test_a_nested_group_is_built_from_its_flags() -> None:
    seen: list = []
    args = ["n1", "--job", "j", "-c", "h:1", "--run-dir", "/r", "--timeout", "2", "--last", "3"]
    result = CliRunner().invoke(_app(seen), args)
    assert result.exit_code == 0, result.output
    assert seen == [("n1", _Where("j", Target("h:1", Path("/r"), 2.0)), 3)]


def test_defaults_and_help_order() -> None:
    seen: list = []
    result = CliRunner().invoke(_app(seen), ["n1"])
    assert result.exit_code == 0, result.output
    assert seen == [("n1", _Where("", Target("", None, 15.0)), 0)]
    text = CliRunner().invoke(_app([]), ["--help"], env={"COLUMNS": "200"}).output
    flags = ["--job", "--coordinator", "--run-dir", "--timeout", "--last"]
    assert [text.index(f) for f in flags] == sorted(text.index(f) for f in flags)


LONG_CALLS = [
    (["ckpt", "restore", "j.s000000000004.ab"], "RestoreCheckpoint",
     coordinator.RestoreCheckpointResponse(job=coordinator.Job(job_id="j", step=4))),
    (["ckpt", "verify", "j.s000000000004.ab"], "VerifyCheckpoint",
     coordinator.VerifyCheckpointResponse(ok=True, chunks_checked=3)),
    (["ckpt", "rm", "j.s000000000004.ab"], "DeleteCheckpoint",
     coordinator.DeleteCheckpointResponse(chunks_collected=2)),
]  # fmt: skip


@pytest.mark.parametrize(("args", "method", "answer"), LONG_CALLS, ids=lambda a: str(a)[:20])
def test_calls_that_walk_a_checkpoint_may_take_all_of_their_timeout(
    monkeypatch, args, method, answer
) -> None:
    """One attempt may last the whole --timeout (150 s unless given): under a plain
    call's 5 s it would time out and be sent again, starting the same work over."""
    attempts: list[tuple[str, float]] = []

    async def once(self, address, called, request, timeout_s=None):  # the network, faked
        attempts.append((called, timeout_s or self.call_timeout_s))
        return answer

    monkeypatch.setattr(CoordinatorClient, "_once", once)
    runner = CliRunner()
    done = runner.invoke(stalwart, [*args, "-c", "127.0.0.1:1", "-o", "json"])
    assert done.exit_code == 0, done.output
    assert attempts == [(method, LONG_TIMEOUT_S)]
    attempts.clear()
    done = runner.invoke(stalwart, [*args, "-c", "127.0.0.1:1", "--timeout", "400"])
    assert done.exit_code == 0, done.output
    assert attempts == [(method, 400.0)]
    text = runner.invoke(stalwart, [*args[:2], "--help"], env={"COLUMNS": "200"}).output
    assert "seconds to wait" in text and f"{LONG_TIMEOUT_S:.1f}" in text


@pytest.mark.parametrize(
    "args, error",
    [
        (["jobs", "--bogus"], "Error: No such option: --bogus (see 'stalwart jobs --help')"),
        (["job", "create"], "Error: No such command 'create' (see 'stalwart job --help')"),
        (
            ["sim", "ettr", "--days", "abc"],
            "Error: Invalid value for '--days': Input should be a valid number, unable to "
            "parse string as a number (see 'stalwart sim ettr --help')",
        ),
    ],
)
def test_usage_errors_are_one_error_line(monkeypatch, capsys, args, error) -> None:
    """The installed command (``main``) refuses a mistyped command line as it refuses
    any other bad input: exit 2 and one `Error:` line naming where help is."""
    monkeypatch.setattr("sys.argv", ["stalwart", *args])
    with pytest.raises(SystemExit) as done:
        main()
    out, err = capsys.readouterr()
    assert done.value.code == 2 and out == ""
    assert err.splitlines() == [error]


def test_the_installed_command_keeps_help_and_exit_codes(monkeypatch, capsys) -> None:
    for args, code in ((["job"], 2), (["--help"], 0), (["version"], 0)):
        monkeypatch.setattr("sys.argv", ["stalwart", *args])
        with pytest.raises(SystemExit) as done:
            main()
        out, err = capsys.readouterr()
        assert done.value.code == code, args
        assert ("Usage: stalwart" in out + err) == (args != ["version"])


def _raising(exc: BaseException) -> typer.Typer:
    app = typer.Typer()

    @app.command()
    def go() -> None:
        raise exc

    @app.command()
    def other() -> None:  # two commands: "go" is a subcommand, as in stalwart
        pass

    return app


@pytest.mark.parametrize(
    "exc, code, stderr",
    [
        (EOFError(), 1, "Aborted!\n"),  # typer turns it into Abort
        (KeyboardInterrupt(), 130, ""),
        (SystemExit(143), 143, ""),  # what SIGTERM raises (_exit_on_sigterm)
    ],
)
def test_what_a_command_raises_ends_it_with_its_own_code(
    monkeypatch, capsys, exc, code, stderr
) -> None:
    """Every exception a command lets out passes main's handlers and ends the command
    with its code (the handlers named a class typer 0.29 does not have, so each of
    these ended in an AttributeError instead)."""
    monkeypatch.setattr("stalwart.cli.main.app", _raising(exc))
    monkeypatch.setattr("sys.argv", ["stalwart", "go"])
    with pytest.raises(SystemExit) as done:
        main()
    assert done.value.code == code
    assert capsys.readouterr().err.strip() == stderr.strip()


def test_sigterm_unwinds_the_command_with_143(monkeypatch) -> None:
    ran_finally: list[bool] = []
    app = typer.Typer()

    @app.command()
    def go() -> None:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            signal.pause()  # until the handler has raised
        finally:
            ran_finally.append(True)

    @app.command()
    def other() -> None:
        pass

    monkeypatch.setattr("stalwart.cli.main.app", app)
    monkeypatch.setattr("sys.argv", ["stalwart", "go"])
    with pytest.raises(SystemExit) as done:
        main()
    assert done.value.code == 143 and ran_finally == [True]


@pytest.mark.parametrize(
    "args, error",
    [  # each used to end in a traceback, or to act before refusing
        (["job", "submit", "--steps", "99999999999999999999", "-c", "127.0.0.1:1"],
         "Error: --steps 99999999999999999999: at most 9,223,372,036,854,775,807"),
        (["up", "--runs-root", "/proc/no-such-folder"],
         "Error: /proc/no-such-folder: No such file or directory"),
        (["jobs", "-c", ","], "Error: --coordinator ',' names no address"),
        (["job", "submit", "--steps", "0", "-c", "127.0.0.1:1"],
         "Error: --steps 0: give 1 or more, or leave it out for the model's default"),
        (["sim", "ettr", "--gpus", "8", "--days", "1", "--seeds", "1", "--params-b", "inf"],
         "Error: Invalid value for '--params-b': Input should be less than or equal to 1000000"),
        (["job", "submit", "--lr", "0", "-c", "127.0.0.1:1"],
         "Error: --lr 0: give a rate above 0, or leave it out for the model's default"),
        (["job", "submit", "--shards", "0", "-c", "127.0.0.1:1"],
         "Error: --shards 0: give 1 or more, or leave it out for the model's default"),
        (["job", "export", "j", "-o", "json", "-c", "127.0.0.1:1"],
         "Error: -o is --file here (the file to write), not 'json': for JSON give --output json"),
    ],
)  # fmt: skip
def test_bad_values_are_one_error_line_before_anything_is_done(args, error) -> None:
    result = CliRunner().invoke(stalwart, args)
    assert result.exit_code == 2, result.output
    assert result.output.splitlines()[-1] == error
