"""Which cluster a command talks to: ``--coordinator`` addresses, or the local run folder.

Precedence: ``--coordinator`` (or ``STALWART_COORDINATOR``), then ``--run-dir``
(or ``STALWART_RUN_DIR``), then ``runs/latest`` as left by ``stalwart up``; a flag
given on the command line beats an environment variable of a higher rank (an
exported ``STALWART_COORDINATOR`` does not override ``--run-dir`` typed now).

A command takes the three flags as one parameter, ``cluster: Target = FROM_FLAGS``,
under the ``option_groups`` decorator; other groups of flags work the same way.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import os
import re
import sys
import time
import typing
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console

from stalwart import cluster
from stalwart.cli.output import ExitCode, fail
from stalwart.client.coordinator import CoordinatorClient

T = TypeVar("T")

COORDINATOR = typer.Option(
    "",
    "--coordinator",
    "-c",
    envvar="STALWART_COORDINATOR",
    help="coordinator replicas, host:port[,host:port]; default: the local cluster's",
)
RUN_DIR = typer.Option(
    None,
    "--run-dir",
    envvar="STALWART_RUN_DIR",
    help="run folder of a local cluster; default: runs/latest",
)
TIMEOUT = typer.Option(
    15.0, "--timeout", min=0.1, help="seconds to keep trying to reach a leader before giving up"
)
# Longer than the coordinator's own bound on checkpoint store work (its
# --checkpoint-timeout-seconds, 120 by default), so that its answer naming the slow
# store arrives before this side gives up.
LONG_TIMEOUT_S = 150.0
LONG_TIMEOUT = typer.Option(
    LONG_TIMEOUT_S, "--timeout", min=0.1,
    help="seconds to wait for the answer (the coordinator reads the whole checkpoint first)",
)  # fmt: skip


_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)$")  # [v6] or a name / v4 address


def check_address(text: str, flag: str) -> str:
    """``host:port`` as given, or exit 2 with one line: a malformed address (a scheme,
    no port, a port past 65535, a space) was dialled until --timeout and reported as
    an unreachable cluster."""
    host, sep, port = text.rpartition(":")
    if not sep or not _HOST.match(host) or not port.isdigit() or not 0 < int(port) < 65536:
        fail(f"{flag} {text!r} is not host:port (a port 1-65535; [v6 address]:port)",
             ExitCode.INVALID_INPUT)  # fmt: skip
    return text


def from_environment(variable: str, value: object) -> bool:
    """Whether a flag's ``value`` is what its environment ``variable`` holds: taken
    from there rather than typed (typing the same value again changes nothing)."""
    exported = os.environ.get(variable)
    return exported is not None and value is not None and str(value) == exported


def addresses(coordinator: str, run_dir: Path | None) -> list[str]:
    """The coordinator addresses to dial, or exit with one readable line."""
    exported = from_environment("STALWART_COORDINATOR", coordinator)
    if exported and run_dir is not None and not from_environment("STALWART_RUN_DIR", run_dir):
        coordinator = ""  # --run-dir typed now beats an exported STALWART_COORDINATOR
    if coordinator.strip():
        given = [a.strip() for a in coordinator.split(",") if a.strip()]
        if not given:
            fail(f"--coordinator {coordinator!r} names no address", ExitCode.INVALID_INPUT)
        return [check_address(a, "--coordinator") for a in given]
    try:
        run = cluster.find_run(run_dir)
        local = cluster.load(run)
    except cluster.ClusterError as exc:
        fail(f"{exc}; or pass --coordinator host:port", ExitCode.UNREACHABLE)
    if local.stopped_at:
        fail(
            f"the local cluster in {run} is stopped (stalwart down); "
            "start one with `stalwart up` or pass --coordinator host:port",
            ExitCode.UNREACHABLE,
        )
    if not local.coordinator_addresses:
        fail(f"the local cluster in {run} has no coordinator", ExitCode.UNREACHABLE)
    return local.coordinator_addresses


FROM_FLAGS: Any = object()
"""The default of a parameter that ``option_groups`` fills from its dataclass's flags."""


@dataclasses.dataclass(frozen=True)
class Target:
    """The cluster a command talks to: its --coordinator, --run-dir and --timeout."""

    coordinator: str = COORDINATOR
    run_dir: Path | None = RUN_DIR
    timeout: float = TIMEOUT

    def addresses(self) -> list[str]:
        return addresses(self.coordinator, self.run_dir)

    def attempt_s(self) -> float:
        """How long one attempt of a call may take (the next replica is tried after)."""
        return min(self.timeout, 5.0)

    def client(self, targets: list[str]) -> CoordinatorClient:
        """A leader-following client of ``targets`` that keeps trying for --timeout."""
        return CoordinatorClient(
            targets, call_timeout_s=self.attempt_s(), retry_for_s=self.timeout,
            on_retry=StillTrying.on_terminal(targets, self.timeout),
        )  # fmt: skip

    def call(self, fn: Callable[[CoordinatorClient], Awaitable[T]]) -> T:
        """Run ``fn(client)`` on a leader-following client, closed afterwards."""
        targets = self.addresses()

        async def go() -> T:
            async with self.client(targets) as client:
                return await fn(client)

        return asyncio.run(go())


@dataclasses.dataclass(frozen=True)
class LongTarget(Target):
    """The cluster of a command whose call does long work before it answers (reading,
    verifying or loading a whole checkpoint): one attempt may take all of --timeout
    (under the 5 s of a plain call it would time out and be sent again, only to
    start the same work over), and a spinner on a terminal's stderr shows the wait."""

    timeout: float = LONG_TIMEOUT

    def attempt_s(self) -> float:
        return self.timeout

    def call(self, fn: Callable[[CoordinatorClient], Awaitable[T]], doing: str = "waiting") -> T:
        """:meth:`Target.call`, with ``doing`` beside a spinner while it runs."""
        console = Console(stderr=True)
        if not console.is_terminal:  # scripts and tests: stderr keeps only errors
            return super().call(fn)
        with console.status(f"{doing} (up to {self.timeout:.0f} s)"):
            return super().call(fn)


class StillTrying:
    """Says once on stderr that no leader has answered yet, when a command has kept
    trying for ``NOTICE_AFTER_S``: a cluster that is down, or a wrong address, would
    otherwise look like a hung command for all of --timeout (15 s by default). Only on
    a terminal: for scripts and tests stderr keeps only errors."""

    NOTICE_AFTER_S = 1.0

    def __init__(self, targets: list[str], timeout: float, stream=None) -> None:
        self.targets, self.timeout = targets, timeout
        self.stream = stream  # None: sys.stderr when said (a live display may redirect it)
        self.started = time.monotonic()
        self.said = False

    @classmethod
    def on_terminal(cls, targets: list[str], timeout: float) -> StillTrying | None:
        return cls(targets, timeout) if sys.stderr.isatty() else None

    def __call__(self, err: BaseException | None) -> None:
        waited = time.monotonic() - self.started
        if self.said or waited < self.NOTICE_AFTER_S:
            return
        self.said = True
        why = (getattr(err, "message", "") or type(err).__name__).splitlines()[0]
        print(f"no leader at {','.join(self.targets)} yet ({why}); "
              f"trying for up to {self.timeout:g} s (--timeout)…",
              file=self.stream or sys.stderr, flush=True)  # fmt: skip


def option_groups(command: Callable) -> Callable:
    """Let ``command`` take a dataclass of options as one parameter (default ``FROM_FLAGS``).

    The dataclass's fields, each with a ``typer.Option`` default, stand where the
    parameter stood (so --help lists them in that place); the command gets them
    back as one dataclass. A field that is such a dataclass itself is expanded too.
    """
    hints = typing.get_type_hints(command)
    signature = inspect.signature(command)
    groups = {n: hints[n] for n, p in signature.parameters.items() if p.default is FROM_FLAGS}
    params = [flag for p in signature.parameters.values() for flag in _flags(p, hints[p.name])]

    @functools.wraps(command)
    def run(**values: Any) -> Any:
        for name, group in groups.items():
            values[name] = _gather(group, values)
        return command(**values)

    run.__signature__ = signature.replace(parameters=params)
    run.__annotations__ = {p.name: p.annotation for p in params}
    return run


def _flags(param: inspect.Parameter, annotation: Any) -> list[inspect.Parameter]:
    """The parameter itself, or the fields of its group as parameters of the same kind."""
    if param.default is not FROM_FLAGS:
        return [param.replace(annotation=annotation)]
    hints = typing.get_type_hints(annotation)
    return [
        flag
        for field in dataclasses.fields(annotation)
        for flag in _flags(param.replace(name=field.name, default=field.default), hints[field.name])
    ]


def _gather(group: type, values: dict[str, Any]) -> Any:
    """Take the group's fields out of ``values`` and build the group from them."""
    hints = typing.get_type_hints(group)
    fields = {}
    for f in dataclasses.fields(group):
        nested = f.default is FROM_FLAGS
        fields[f.name] = _gather(hints[f.name], values) if nested else values.pop(f.name)
    return group(**fields)
