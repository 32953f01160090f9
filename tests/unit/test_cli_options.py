"""Option groups: a dataclass of flags taken as one parameter, listed in its place in --help."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import typer
from typer.testing import CliRunner

from stalwart.cli.main import app as stalwart
from stalwart.cli.target import FROM_FLAGS, Target, option_groups


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


def test_restore_keeps_its_longer_timeout() -> None:
    text = CliRunner().invoke(stalwart, ["ckpt", "restore", "--help"], env={"COLUMNS": "200"})
    assert "seconds to wait" in text.output and "120.0" in text.output
