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


@app.command("ckpt")
def bench_ckpt(
    redis_url: str = typer.Option("", help="Redis to use; default: start one for the run"),
    ignite_url: str = typer.Option("", help="Ignite to use; default: start one for the run"),
    model_mib: int = typer.Option(256, min=1, help="float32 model size, MiB"),
    output: Output = OUTPUT_OPTION,
) -> None:
    """Checkpoint save/restore MB/s vs raw store put/get and torch.save/load, training
    stall per checkpoint, and delta size ratios, on shm, Redis and Ignite."""
    import contextlib
    import tempfile

    from stalwart.bench import backends
    from stalwart.bench import ckpt as bench  # torch import is slow: only when asked
    from stalwart.cli.output import ExitCode, fail
    from stalwart.errors import StalwartError

    shm = tempfile.mkdtemp(prefix="stalwart-bench-", dir="/dev/shm")
    try:
        with contextlib.ExitStack() as stack:
            urls = {"shm": f"shm://{shm}"}
            for name, given in (("redis", redis_url), ("ignite", ignite_url)):
                urls[name] = given or stack.enter_context(backends.started(name))
            if output is Output.table:
                with Console(stderr=True).status("measuring checkpoints…"):
                    result = bench.main(urls, model_mib)
                emit_mapping("checkpoint bench (same run)", result)
            else:
                emit_json(bench.main(urls, model_mib))
    except backends.BackendError as exc:
        fail(str(exc), ExitCode.UNREACHABLE)
    except StalwartError as exc:  # an unreachable --redis-url / --ignite-url, named
        fail(str(exc), ExitCode.UNREACHABLE)
    finally:
        import shutil

        shutil.rmtree(shm, ignore_errors=True)
