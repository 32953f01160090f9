"""``stalwart demo``: train digits-cnn on a local cluster while killing a trainer, the
paramserver primary and the coordinator leader, and while a trainer heats up until the
health service has it drained; report recovery, accuracy and bitwise equality."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from stalwart.cli.output import OUTPUT_OPTION, ExitCode, Output, emit, fail


def demo(
    steps: int = typer.Option(400, min=8, help="sync steps to train"),
    trainers: int = typer.Option(3, min=2, help="trainers (= slots)"),
    standbys: int = typer.Option(1, min=1, help="warm standbys"),
    seed: int = typer.Option(0, min=0, help="job seed (weights and every batch)"),
    width: int = typer.Option(0, min=0, help="digits-cnn width (channels); 0: the default, 32"),
    reference: bool = typer.Option(True, help="compute the fault-free run and compare bitwise"),
    health: bool = typer.Option(
        True, help="run the health service; trainer-0 heats up and must be drained before it dies"
    ),
    runs_root: Path = typer.Option(Path("runs"), help="where the run folder goes"),
    output: Output = OUTPUT_OPTION,
) -> None:
    """Train a real model while processes are killed; print what failed, what recovered,
    how long it took, the final accuracy and whether the weights equal a fault-free run."""
    from stalwart import cluster
    from stalwart.demo import report as report_mod
    from stalwart.demo import run as demo_run  # imports torch: only when asked

    config = demo_run.DemoConfig(
        steps=steps, trainers=trainers, standbys=standbys, seed=seed,
        model_args={"width": str(width)} if width else {}, reference=reference,
        runs_root=runs_root, health=health,
    )  # fmt: skip
    console = Console(stderr=True)
    bar = Progress(
        TextColumn("{task.description:<44}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), console=console, disable=output is Output.json,
    )  # fmt: skip
    task = bar.add_task("starting", total=steps)

    def on_progress(what: str, step: int, total: int) -> None:
        if what.startswith("kill"):
            bar.console.print(f"[red]{what}[/red] at step {step}")
        bar.update(task, description=what, completed=step, total=total)

    try:
        with bar:
            result = asyncio.run(demo_run.run(config, on_progress))
    except (cluster.ClusterError, TimeoutError) as exc:
        fail(str(exc).splitlines()[0], ExitCode.FAILED)
    json_path, html_path = report_mod.write(result, Path(result["run_dir"]))
    result["json"], result["html"] = str(json_path), str(html_path)
    json_path.write_text(json.dumps(result, indent=2))
    emit(output, result, lambda: report_mod.render(result))
    if not result["ok"]:
        raise typer.Exit(int(ExitCode.FAILED))
