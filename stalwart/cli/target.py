"""Which cluster a command talks to: ``--coordinator`` addresses, or the local run folder.

Precedence: ``--coordinator`` (or ``STALWART_COORDINATOR``), then ``--run-dir``
(or ``STALWART_RUN_DIR``), then ``runs/latest`` as left by ``stalwart up``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import typer

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


def addresses(coordinator: str, run_dir: Path | None) -> list[str]:
    """The coordinator addresses to dial, or exit with one readable line."""
    if coordinator.strip():
        return [a.strip() for a in coordinator.split(",") if a.strip()]
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


def call(
    coordinator: str,
    run_dir: Path | None,
    timeout_s: float,
    fn: Callable[[CoordinatorClient], Awaitable[T]],
) -> T:
    """Run ``fn(client)`` on a leader-following client, closed afterwards."""
    targets = addresses(coordinator, run_dir)

    async def go() -> T:
        async with CoordinatorClient(
            targets, call_timeout_s=min(timeout_s, 5.0), retry_for_s=timeout_s
        ) as client:
            return await fn(client)

    return asyncio.run(go())
