"""``stalwart up`` / ``stalwart down``: a local cluster of processes on loopback."""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer
from rich.console import Console

from stalwart import cluster
from stalwart.cli.output import (
    OUTPUT_OPTION,
    ExitCode,
    Output,
    cli_errors,
    emit,
    emit_table,
    fail,
)
from stalwart.cli.target import RUN_DIR, from_environment

RUNS_ROOT = typer.Option(
    cluster.DEFAULT_RUNS_ROOT, "--runs-root", help="where run folders go (runs/<timestamp>)"
)


def members_table(title: str, local: cluster.LocalCluster) -> None:
    emit_table(
        title,
        ["name", "role", "started as", "address", "pid"],
        [
            (m.name, m.role + (f" {m.shard}" if m.shard >= 0 else ""), m.started_as,
             m.address, m.pid)
            for m in local.members
        ],
    )  # fmt: skip


def cluster_data(local: cluster.LocalCluster) -> dict:
    return {
        "run_dir": str(local.run_dir),
        "store_url": local.store_url,
        "coordinators": local.coordinator_addresses,
        "health": local.health_address,
        "stopped": local.stopped_at is not None,
        "members": [vars(m) for m in local.members],
        "launcher": vars(local.launcher) if local.launcher else None,
    }


def up(
    trainers: int = typer.Option(3, min=0, help="trainers that take slots"),
    standbys: int = typer.Option(1, min=0, help="warm standby trainers"),
    shards: int = typer.Option(1, min=1, help="paramserver shard groups"),
    backups: int = typer.Option(
        1, min=0, help="backups per shard group (each group also has a primary and a warm spare)"
    ),
    store_url: str = typer.Option(
        "",
        help="coordination and checkpoint store; default: a fresh shm:///dev/shm/stalwart/<run>,"
        " removed by down. file://DIR keeps jobs and checkpoints across down/up (job resume)",
    ),
    runs_root: Path = RUNS_ROOT,
    timeout: float = typer.Option(180.0, min=1, help="longest wait for everything to serve"),
    health: bool = typer.Option(
        True, help="start the health service; trainers stream to it, coordinators drain on it"
    ),
    device: str = typer.Option(
        "auto", help="trainers' device: auto (one GPU each, else CPU), cpu, cuda or cuda:N"
    ),
    preload: bool = typer.Option(
        True,
        help="fork every service from one detached launcher that imported torch once"
        " (stopped by down); --no-preload: a fresh interpreter per service",
    ),
    paramserver_memory_mib: int | None = typer.Option(
        None,
        min=0,
        help="each paramserver's memory budget (a job that would take more is refused); "
        "default: a quarter of this machine's memory; 0: none (what is free at each job)",
    ),  # fmt: skip
    output: Output = OUTPUT_OPTION,
) -> None:
    """Start 2 coordinators, paramserver groups, trainers, standbys and the health service
    as local processes."""
    device = check_device(device, trainers + standbys)
    refuse_if_up(runs_root)
    config = cluster.ClusterConfig(
        trainers=trainers, standbys=standbys, shards=shards, backups=backups,
        store_url=store_url, runs_root=runs_root, start_timeout_s=timeout, health=health,
        device=device, launcher=preload,
        paramserver_memory_bytes=None if paramserver_memory_mib is None
        else paramserver_memory_mib << 20,
    )  # fmt: skip
    console = Console(stderr=True)
    try:
        with console.status("starting processes (imports take a while on a small machine)…"):
            local = cluster.start(config)
            try:
                asyncio.run(cluster.wait_healthy(local, timeout))
            except cluster.ClusterError:
                local.stop(timeout_s=5)
                raise
    except cluster.ClusterError as exc:
        fail(str(exc).splitlines()[0] + " (logs in the run folder)", ExitCode.FAILED)
    emit(output, cluster_data(local), lambda: _print_started(local, console))


def refuse_if_up(runs_root: Path) -> None:
    """Exit 2 while the cluster ``<runs_root>/latest`` names still runs: a new one would
    move ``latest`` off it, out of the reach of ``stalwart down``."""
    running = cluster.live_run(runs_root)
    if running is not None:
        fail(f"a cluster is already up in {running.run_dir}: stalwart down first, or give "
             "another --runs-root", ExitCode.INVALID_INPUT)  # fmt: skip


def check_device(text: str, trainers: int) -> str:
    """``text`` normalised; exit 2 unless every local trainer can have it (they run here)."""
    from stalwart import devices

    try:
        choice = devices.parse(text)
        if choice.kind == "cuda":  # only then is torch worth importing (seconds)
            import torch

            count = torch.cuda.device_count() if torch.cuda.is_available() else 0
            for index in range(max(trainers, 1)):
                devices.select(choice, index, count)
    except devices.DeviceError as exc:
        fail(f"--device: {exc}", ExitCode.INVALID_INPUT)
    return str(choice)


def _print_started(local: cluster.LocalCluster, console: Console) -> None:
    members_table(f"cluster up in {local.run_dir}", local)
    health = f"health service: {local.health_address}\n" if local.health_address else ""
    console.print(
        f"logs: {local.log_dir}\ncoordinators: {','.join(local.coordinator_addresses)}\n"
        f"{health}next: stalwart status, stalwart job submit --wait, stalwart health, "
        "stalwart down"
    )


def down(
    run_dir: Path | None = RUN_DIR,
    runs_root: Path = RUNS_ROOT,
    timeout: float = typer.Option(15.0, min=0, help="SIGTERM grace before SIGKILL, seconds"),
    output: Output = OUTPUT_OPTION,
) -> None:
    """Stop a local cluster (SIGTERM, then SIGKILL after --timeout) and free its store."""
    if from_environment("STALWART_RUN_DIR", run_dir) and runs_root != cluster.DEFAULT_RUNS_ROOT:
        run_dir = None  # --runs-root typed now beats an exported STALWART_RUN_DIR
    try:
        folder = cluster.find_run(run_dir, runs_root)
        local, running = cluster.stop_run(folder, timeout)
    except cluster.ClusterError as exc:
        fail(str(exc), ExitCode.INVALID_INPUT)
    stopped = (f"stopped {running} of the {len(local.members)} processes of {local.run_dir}"
               if running else f"nothing was running in {local.run_dir}")  # fmt: skip
    emit(output, cluster_data(local), lambda: Console().print(stopped))


def register(app: typer.Typer) -> None:
    app.command("up")(cli_errors(up))
    app.command("down")(cli_errors(down))
