"""``stalwart bench``: benchmarks that print ratios against a baseline measured in the same run."""

from __future__ import annotations

import typer
from rich.console import Console

from stalwart.cli.output import OUTPUT_OPTION, Output, emit_json, emit_mapping

app = typer.Typer(help="Benchmarks with same-run baselines.", no_args_is_help=True)


@app.command("ps")
def bench_ps(
    model_mib: int = typer.Option(64, help="float32 model size, MiB"),
    repeats: int = typer.Option(5, min=1, help="timed rounds after one warm-up"),
    output: Output = OUTPUT_OPTION,
) -> None:
    """Paramserver push/pull MB/s vs raw gRPC, and the cost of replication."""
    from stalwart.bench import ps  # torch import is slow: only when asked

    if output is Output.table:
        with Console(stderr=True).status("starting paramservers and measuring…"):
            result = ps.main(model_mib, repeats)
        emit_mapping("paramserver vs raw gRPC (same run)", result)
    else:
        emit_json(ps.main(model_mib, repeats))
