"""``stalwart sim``: what Stalwart buys at 1k-100k GPUs, simulated from published failure
data and our own measurements (stalwart/sim, docs/scale.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from stalwart.cli.output import (
    OUTPUT_OPTION,
    ExitCode,
    Output,
    check_output_file,
    emit,
    emit_table,
    fail,
)

app = typer.Typer(help="Scale simulations driven by our measurements.", no_args_is_help=True)

_JSON = {"exists": False, "dir_okay": False}


MIN_GPUS, MAX_GPUS = 8, 1_000_000


def _gpus(text: str, replica_gpus: int) -> tuple[int, ...]:
    try:
        values = tuple(int(v.replace("_", "")) for v in text.split(",") if v.strip())
    except ValueError:
        fail(f"--gpus wants comma-separated integers, got {text!r}", ExitCode.INVALID_INPUT)
    if not values:
        fail("--gpus wants at least one GPU count", ExitCode.INVALID_INPUT)
    for count in values:
        _check_gpu_count("--gpus", count, replica_gpus)
    return values


def _check_gpu_count(flag: str, count: int, replica_gpus: int) -> None:
    """A job size the simulation can model: within the range its models were sized for,
    and at least one whole data-parallel replica (a smaller job was modelled as one
    replica anyway, and a sweep at 10^8 GPUs ran for hours)."""
    if not MIN_GPUS <= count <= MAX_GPUS:
        fail(f"{flag} values must be between {MIN_GPUS} and {MAX_GPUS:,}, got {count}",
             ExitCode.INVALID_INPUT)  # fmt: skip
    if count < replica_gpus:
        fail(
            f"{flag} {count} holds no whole replica of --replica-gpus {replica_gpus}",
            ExitCode.INVALID_INPUT,
        )


@app.command("ettr")
def ettr(
    gpus: str = typer.Option("1024,16384,100000", help="comma-separated GPU counts"),
    days: float = typer.Option(54.0, min=1.0, max=365.0, help="simulated wall time per run"),
    seeds: int = typer.Option(3, min=1, max=50, help="runs per point (means are reported)"),
    seed: int = typer.Option(0, help="first seed: the same seed gives the same numbers"),
    failures: str = typer.Option("llama3", help="llama3 | meta | trace"),
    strategies: str = typer.Option(
        "restart-all,torchft,stalwart,stalwart+drain",
        help="comma-separated recovery strategies to simulate side by side",
    ),
    standbys: int = typer.Option(2, min=0, help="warm standby nodes (Stalwart)"),
    refill: str = typer.Option(
        "scheduler", help="scheduler | repair: where a used standby comes back from"
    ),
    precursor_share: float = typer.Option(
        0.3, min=0.0, max=1.0, help="share of precursor-kind failures that show one"
    ),
    recall: float = typer.Option(
        None, min=0.0, max=1.0, help="predictor recall (default: measured)"
    ),
    # upper bounds too: inf passed `min` alone, and gave Infinity in the JSON or ran for ever
    gray_per_failure: float = typer.Option(
        0.25, min=0.0, max=100.0, help="gray failures per hard failure"
    ),
    replica_gpus: int = typer.Option(128, min=1, help="GPUs per data-parallel replica (TP x PP)"),
    params_b: float = typer.Option(405.0, min=0.001, max=1e6, help="model parameters, billions"),
    step_s: float = typer.Option(
        6.0, min=0.001, max=86400.0, help="step time at 16,384 GPUs (fixed global batch)"
    ),
    recovery_json: Path = typer.Option(
        None, "--recovery", help="stalwart bench recovery -o json", **_JSON
    ),
    ddp_json: Path = typer.Option(None, "--ddp", help="stalwart bench ddp -o json", **_JSON),
    overhead_json: Path = typer.Option(
        None, "--overhead", help="stalwart bench overhead -o json", **_JSON
    ),
    ckpt_json: Path = typer.Option(None, "--ckpt", help="stalwart bench ckpt -o json", **_JSON),
    ckpt_store: str = typer.Option("shm", help="which backend of the ckpt JSON"),
    health_json: Path = typer.Option(
        None, "--health", help="health eval -o json, or {precision, recall, lead_time_h}", **_JSON
    ),
    html: Path = typer.Option(None, help="also write the picture: self-contained HTML"),
    sensitivity: int = typer.Option(
        0, min=0, help="GPU count for the sensitivity sweeps (0: none)"
    ),
    anchors: bool = typer.Option(True, help="the Llama 3 and ByteRobust sanity runs"),
    output: Output = OUTPUT_OPTION,
) -> None:
    """ETTR and effective throughput of one job per strategy and N (restart-all at the
    Young-Daly interval, torchft-style live recovery, Stalwart with and without drain)."""
    from stalwart import sim
    from stalwart.sim import render
    from stalwart.sim.run import FAILURE_SOURCES

    names = tuple(s.strip() for s in strategies.split(",") if s.strip())
    bad = [n for n in names if n not in sim.STRATEGIES]
    if bad or not names:
        fail(
            f"unknown strategy {bad or strategies!r}; have {', '.join(sim.STRATEGIES)}",
            ExitCode.INVALID_INPUT,
        )
    if failures not in FAILURE_SOURCES:
        fail(f"--failures must be one of {', '.join(FAILURE_SOURCES)}", ExitCode.INVALID_INPUT)
    if html:
        check_output_file(html, "--html")
    if refill not in ("scheduler", "repair"):
        fail("--refill must be scheduler or repair", ExitCode.INVALID_INPUT)
    gpu_counts = _gpus(gpus, replica_gpus)  # all checked before the trace is looked for
    if sensitivity:
        _check_gpu_count("--sensitivity", sensitivity, replica_gpus)
    try:
        measured = sim.load(
            recovery_json, ddp_json, overhead_json, ckpt_json, health_json, ckpt_store
        )
    except sim.InputError as exc:
        fail(str(exc), ExitCode.INVALID_INPUT)
    try:
        fit = sim.load_fit()
    except sim.TraceMissing as exc:
        if failures == "trace":
            fail(str(exc), ExitCode.INVALID_INPUT)
        print(f"note: {exc}; repair times use built-in defaults", file=sys.stderr)
        fit = None
    cfg = sim.SimConfig(
        gpus=gpu_counts,
        days=days,
        seeds=seeds,
        seed=seed,
        failures=failures,
        strategies=names,
        standbys=standbys,
        refill=refill,
        precursor_share=precursor_share,
        recall=recall,
        gray_per_failure=gray_per_failure,
        workload={"replica_gpus": replica_gpus, "params": params_b * 1e9, "step_s_at_16k": step_s},
    )
    doc = _simulated(cfg, measured, fit, anchors, sensitivity or None, show=output is Output.table)
    if html:
        html.write_text(render.html_report(doc))
    emit(output, doc, lambda: _tables(doc))


def _simulated(cfg, measured, fit, anchors: bool, sensitivity: int | None, show: bool) -> dict:
    """``sim.run.document`` with a progress bar on stderr (one tick per simulated seed):
    a million GPUs over 365 days and 50 seeds runs for tens of minutes."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from stalwart import sim

    console = Console(stderr=True)
    bar = Progress(
        TextColumn("simulating"), BarColumn(), MofNCompleteColumn(), TextColumn("seed runs"),
        TimeElapsedColumn(), console=console, transient=True,
        disable=not (show and console.is_terminal),  # a log gets no half-drawn bars
    )  # fmt: skip
    task = bar.add_task("", total=sim.run.seed_runs(cfg, anchors, sensitivity))
    with bar:
        return sim.run.document(
            cfg, measured, fit, anchors, sensitivity, tick=lambda: bar.advance(task)
        )


def _tables(doc: dict) -> None:
    from stalwart.sim import render

    print(doc["summary"])
    emit_table(
        "ETTR and effective throughput per strategy",
        render.RESULT_HEADERS,
        render.result_rows(doc["results"]),
    )
    if doc["anchors"]:
        emit_table(
            "sanity against published results",
            ["anchor", "GPUs", "published", "simulated"],
            [
                (a["anchor"], f"{a['gpus']:,}", a["published"], f"{a['simulated_ettr']:.2%}")
                for a in doc["anchors"]
            ],
        )
