"""``stalwart demo``: train a real model (digits-cnn, or ``--model char-lm``) on a local
cluster while killing a trainer, the paramserver primary and the coordinator leader, and
while a trainer heats up until the health service has it drained; report recovery,
held-out quality against the model's goal, and bitwise equality."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from stalwart.cli.cluster import refuse_if_up
from stalwart.cli.jobs import parse_model_args
from stalwart.cli.output import OUTPUT_OPTION, ExitCode, Output, emit, fail


def demo(
    model: str = typer.Option("digits-cnn", help="model to train: digits-cnn, char-lm (or any job model)"),
    steps: int | None = typer.Option(None, min=8, help="sync steps to train; default per model (400, char-lm 300)"),
    trainers: int | None = typer.Option(None, min=2, help="trainers (= slots); default per model (3, char-lm 2)"),
    standbys: int = typer.Option(1, min=1, help="warm standbys"),
    seed: int = typer.Option(0, min=0, help="job seed (weights and every batch)"),
    width: int = typer.Option(0, min=0, help="digits-cnn width (channels); 0: the default, 32"),
    arg: list[str] = typer.Option([], "--arg", help="model argument key=value (repeat), e.g. layers=1"),
    reference: bool = typer.Option(True, help="compute the fault-free run and compare bitwise"),
    health: bool = typer.Option(
        True, help="run the health service; trainer-0 heats up and must be drained before it dies"
    ),
    runs_root: Path = typer.Option(Path("runs"), help="where the run folder goes"),
    output: Output = OUTPUT_OPTION,
) -> None:  # fmt: skip
    """Train a real model while processes are killed; print what failed, what recovered,
    how long it took, the final held-out quality and whether the weights equal a fault-free run."""
    from stalwart import cluster, jobspec
    from stalwart.demo import report as report_mod
    from stalwart.demo import run as demo_run  # imports torch: only when asked

    defaults = jobspec.MODEL_DEFAULTS.get(model, jobspec.FALLBACK_DEFAULTS)
    steps = defaults["steps"] if steps is None else steps
    trainers = max(defaults["slots"], 2) if trainers is None else trainers
    config = demo_run.DemoConfig(
        model=model, steps=steps, trainers=trainers, standbys=standbys, seed=seed,
        model_args=model_args(model, width, arg), reference=reference, runs_root=runs_root,
        health=health,
    )  # fmt: skip
    check_model(demo_run.job_spec(config))
    refuse_if_up(runs_root)  # the demo starts a cluster of its own
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


def model_args(model: str, width: int, args: list[str]) -> dict[str, str]:
    """``--arg key=value`` pairs, and ``--width`` for digits-cnn (exit 2 on bad input)."""
    out = parse_model_args(args)
    if width:
        if model != "digits-cnn":
            fail("--width is digits-cnn's; use --arg for other models", ExitCode.INVALID_INPUT)
        out["width"] = str(width)
    return out


def check_model(spec) -> None:
    """Exit 2 for a model or model argument the task refuses, before starting a cluster."""
    from stalwart.errors import StalwartError
    from stalwart.models import resolve

    try:
        resolve(spec)
    except StalwartError as exc:
        fail(exc.message, ExitCode.INVALID_INPUT)
