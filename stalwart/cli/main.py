"""``stalwart``: the admin CLI. Tables by default, ``--output json`` for scripts."""

from __future__ import annotations

import os
import signal
import sys

import typer

from stalwart import __version__
from stalwart.cli import admin, bench, ckpt, demo, jobs, ps, sim, top
from stalwart.cli import cluster as cluster_cli
from stalwart.cli import health as health_cli
from stalwart.cli.output import ExitCode, cli_errors, error_line

app = typer.Typer(
    help="Stalwart: self-healing distributed PyTorch training.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
app.add_typer(ps.app, name="ps")
app.add_typer(bench.app, name="bench")
app.add_typer(ckpt.app, name="ckpt")
app.add_typer(sim.app, name="sim")
app.add_typer(jobs.app, name="job")
app.command("jobs")(jobs.jobs)
admin.register(app)
cluster_cli.register(app)
app.command()(demo.demo)
app.command("top")(cli_errors(top.top))

# Services run as their own processes: the CLI starts them with exec, it never
# imports their code (the library stays independent of services/).
_SERVICES = {"paramserver": "services.paramserver"}

_PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


def _exec_module(module: str, args: list[str]) -> None:
    os.execv(sys.executable, [sys.executable, "-m", module, *args])


@app.command(context_settings=_PASS_THROUGH, add_help_option=False)
def paramserver(ctx: typer.Context) -> None:
    """Run a paramserver replica (flags as `python -m services.paramserver --help`)."""
    _exec_module(_SERVICES["paramserver"], ctx.args)


health_app = typer.Typer(
    help="Node risk from the health service (no subcommand), and its offline evaluation.",
    invoke_without_command=True,
    callback=cli_errors(health_cli.show),
)
app.add_typer(health_app, name="health")


@health_app.command("eval", context_settings=_PASS_THROUGH, add_help_option=False)
def health_eval(ctx: typer.Context) -> None:
    """Evaluate detectors and failure predictors (flags as `python -m services.health.eval --help`)."""
    _exec_module("services.health.eval", ctx.args)


@app.command()
def version() -> None:
    """Print the version."""
    print(__version__)


# click's exceptions, from wherever typer takes click (installed, or vendored by newer
# typer, which re-exports only BadParameter of them; Abort and Exit are typer's own
# names in both).
_clicks = sys.modules[typer.BadParameter.__module__]


def main() -> None:
    """The ``stalwart`` command: as ``app()``, except that a usage error (unknown command
    or option, a value of the wrong type) is one ``Error:`` line and exit 2, like every
    other bad input, instead of click's usage block; and SIGTERM unwinds the command."""
    _exit_on_sigterm()
    try:
        code = app(standalone_mode=False, prog_name="stalwart")
    except _clicks.UsageError as exc:
        if exc.ctx is not None and exc.message == exc.ctx.get_help():
            exc.show()  # a bare group prints its help, as before
        else:
            error_line(exc.format_message().rstrip(".") + _help_hint(exc.ctx))
        sys.exit(int(ExitCode.INVALID_INPUT))
    except _clicks.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except typer.Abort:  # EOF at a prompt (Ctrl-C is typer's Exit(130))
        print("Aborted!", file=sys.stderr)
        sys.exit(1)
    # Only an explicit exit returns an int here (commands return None).
    sys.exit(code if isinstance(code, int) else 0)


def _exit_on_sigterm() -> None:
    """SIGTERM (``timeout``, a supervisor, ``kill``) ends a command through its
    ``finally`` blocks, as Ctrl-C does, not on the spot: a benchmark then stops the
    services it started at once, rather than when its launcher sees it gone. Exit
    status 143, the signal's own; a second SIGTERM ends it at once."""

    def unwind(signum: int, _frame) -> None:
        signal.signal(signum, signal.SIG_DFL)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, unwind)


def _help_hint(ctx) -> str:
    return f" (see '{ctx.command_path} --help')" if ctx is not None else ""


if __name__ == "__main__":
    main()
