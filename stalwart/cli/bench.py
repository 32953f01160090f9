"""``stalwart bench``: benchmarks that print ratios against a baseline measured in the same run."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import typer
from rich.console import Console

from stalwart.cli.output import OUTPUT_OPTION, ExitCode, Output, emit_record, fail

app = typer.Typer(help="Benchmarks with same-run baselines.", no_args_is_help=True)


def _status(text: str, output: Output):
    """A spinner on stderr for people; nothing for scripts."""
    return contextlib.nullcontext() if output is Output.json else Console(stderr=True).status(text)


@app.command("ps")
def bench_ps(
    model_mib: int = typer.Option(64, help="float32 model size, MiB"),
    repeats: int = typer.Option(5, min=1, help="timed rounds after one warm-up"),
    output: Output = OUTPUT_OPTION,
) -> None:
    """Paramserver push/pull MB/s vs raw gRPC, and the cost of replication."""
    from stalwart.bench import ps  # torch import is slow: only when asked

    with _status("starting paramservers and measuring…", output):
        result = ps.main(model_mib, repeats)
    emit_record(output, "paramserver vs raw gRPC (same run)", result)


@app.command("ckpt")
def bench_ckpt(
    redis_url: str = typer.Option("", help="Redis to use; default: start one for the run"),
    ignite_url: str = typer.Option("", help="Ignite to use; default: start one for the run"),
    model_mib: int = typer.Option(256, min=1, help="float32 model size, MiB"),
    output: Output = OUTPUT_OPTION,
) -> None:
    """Checkpoint save/restore MB/s vs raw store put/get and torch.save/load, training
    stall per checkpoint, and delta size ratios, on shm, Redis and Ignite."""
    import tempfile

    from stalwart.bench import backends
    from stalwart.bench import ckpt as bench  # torch import is slow: only when asked
    from stalwart.errors import StalwartError

    shm = tempfile.mkdtemp(prefix="stalwart-bench-", dir="/dev/shm")
    try:
        with contextlib.ExitStack() as stack:
            urls = {"shm": f"shm://{shm}"}
            for name, given in (("redis", redis_url), ("ignite", ignite_url)):
                urls[name] = given or stack.enter_context(backends.started(name))
            with _status("measuring checkpoints…", output):
                result = bench.main(urls, model_mib)
            emit_record(output, "checkpoint bench (same run)", result)
    except backends.BackendError as exc:
        fail(str(exc), ExitCode.UNREACHABLE)
    except StalwartError as exc:  # an unreachable --redis-url / --ignite-url, named
        fail(str(exc), ExitCode.UNREACHABLE)
    finally:
        import shutil

        shutil.rmtree(shm, ignore_errors=True)


@app.command("overhead")
def bench_overhead(
    steps: int = typer.Option(150, min=20, help="steps of the mlp job (both sides)"),
    warmup: int = typer.Option(30, min=1, help="steps not timed"),
    batch_size: int = typer.Option(64, min=1, help="examples per step"),
    hidden: int = typer.Option(1024, min=8, help="mlp hidden width (4 layers)"),
    output: Output = OUTPUT_OPTION,
) -> None:
    """Samples/s of mlp through Stalwart (1 trainer, replication on) vs a plain torch loop."""
    from stalwart.bench import overhead

    if warmup >= steps:
        fail("--warmup must be below --steps", ExitCode.INVALID_INPUT)
    with _status("plain loop, then a local cluster…", output), _timed_window():
        result = overhead.run(steps, warmup, batch_size, hidden)
    emit_record(output, "training throughput: Stalwart vs plain torch (same run)", result)


@app.command("recovery")
def bench_recovery(
    trials: int = typer.Option(3, min=1, help="kills per fault kind"),
    between: int = typer.Option(20, min=1, help="steps of steady state before each kill"),
    output: Output = OUTPUT_OPTION,
) -> None:
    """kill -9 -> next committed step, per fault kind (median of --trials), lost/repeated steps."""
    from stalwart.bench import recovery

    with _status("killing, timing, replacing (a few minutes)…", output):
        result = recovery.run(trials, between)
    emit_record(output, "recovery: kill -9 to the next committed step", result, _recovery_fields)


def _recovery_fields(result: dict) -> dict:
    return (
        {kind: f"median {v['median_s']} s, max {v['max_s']} s over {v['recovered']}/{v['trials']}"
               f" (goal <= {v['goal_s']} s)" for kind, v in result["kill_to_next_commit"].items()}
        | {k: result[k] for k in ("steps", "lost_or_repeated_steps",
                                  "bitwise_equal_to_reference", "run_dir")}
    )  # fmt: skip


@app.command("sdc")
def bench_sdc(
    steps: int = typer.Option(10, min=1, help="steps per timed round"),
    rounds: int = typer.Option(12, min=1, help="interleaved rounds of each mode"),
    dup_every: int = typer.Option(10, min=1, help="N of 1-in-N duplicate compute"),
    output: Output = OUTPUT_OPTION,
) -> None:
    """Trainer step throughput on mlp with ABFT checks and with 1-in-N duplicate
    compute, against neither, in the same run."""
    from stalwart.bench import sdc  # torch import is slow: only when asked

    result = sdc.main(steps, rounds, dup_every)
    emit_record(output, "silent-data-corruption defences (same run)", result)


@app.command("ddp")
def bench_ddp(
    trials: int = typer.Option(3, min=1, help="runs of each side; figures are medians"),
    steps: int = typer.Option(400, min=30, help="steps of the job (both sides)"),
    warmup: int = typer.Option(20, min=1, help="steps before the steady-state clock starts"),
    kill_at: int = typer.Option(150, min=1, help="step at which one worker is killed -9"),
    local_steps: int = typer.Option(
        0, min=0, max=1024,
        help="Stalwart side as local SGD: H inner steps per push, steps/H outer steps; 0: off",
    ),
    local_lr: float = typer.Option(0.2, min=0.0, help="with --local-steps: inner SGD rate"),
    outer_lr: float = typer.Option(0.7, min=0.0, help="with --local-steps: outer SGD rate"),
    outer_momentum: float = typer.Option(
        0.9, min=0.0, max=0.999, help="with --local-steps: outer Nesterov momentum; 0: none"
    ),
    bf16_gradients: bool = typer.Option(
        False, "--bf16-gradients",
        help="Stalwart side's gradients travel as bfloat16 (JobSpec.gradient_dtype)",
    ),
    output: Output = OUTPUT_OPTION,
) -> None:  # fmt: skip
    """Steps/s, kill -9 recovery and bitwise checks: Stalwart's default local cluster vs
    torchrun + DDP (gloo) on the same job, in the same run; and Stalwart's step timeline.
    With --local-steps, Stalwart runs local SGD / DiLoCo on the same batches; with
    --bf16-gradients its gradients travel as bfloat16; either way both sides' held-out
    accuracy is reported."""
    from stalwart.bench import ddp  # torch import is slow: only when asked

    if not warmup < kill_at < steps:
        fail("need --warmup < --kill-at < --steps", ExitCode.INVALID_INPUT)
    local = None
    if local_steps > 1:
        local = ddp.LocalSgd(local_steps, local_lr, outer_lr, outer_momentum)
        _check_local(local, steps, warmup, kill_at)
    with _status("Stalwart cluster, then torchrun + DDP (minutes)…", output), _timed_window():
        result = ddp.run(trials, steps, warmup, kill_at, local=local, bf16_gradients=bf16_gradients)
    emit_record(output, "Stalwart vs torchrun + DDP (same run)", result, _ddp_fields)


@contextlib.contextmanager
def _timed_window() -> Iterator[None]:
    """A steady-state window too short to time is bad input: one line, exit 2."""
    from stalwart.bench.window import WindowTooShort

    try:
        yield
    except WindowTooShort as exc:
        fail(str(exc), ExitCode.INVALID_INPUT)


def _check_local(local, steps: int, warmup: int, kill_at: int) -> None:
    """Both sides must read the same batches, and the outer clock needs room to run."""
    h = local.steps
    if steps % h:
        fail(f"--steps {steps} must be a multiple of --local-steps {h}", ExitCode.INVALID_INPUT)
    if not 1 <= warmup // h < kill_at // h < steps // h:
        fail(f"--local-steps {h}: need 1 <= warmup/H < kill-at/H < steps/H in outer steps",
             ExitCode.INVALID_INPUT)  # fmt: skip
    if not local.inner_lr > 0 or not local.outer_lr > 0:
        fail("--local-lr and --outer-lr must be > 0", ExitCode.INVALID_INPUT)


_DDP_RATES = ("stalwart_steps_per_s", "ddp_steps_per_s")
_LOCAL_RATES = ("local_steps", "stalwart_inner_steps_per_s", "stalwart_outer_steps_per_s",
                "ddp_steps_per_s")  # fmt: skip


def _ddp_fields(result: dict) -> dict:
    local = "local_steps" in result
    accuracies = local or "gradient_dtype" in result
    keep = (*(_LOCAL_RATES if local else _DDP_RATES), "ratio", "goal",
            *(("stalwart_accuracy", "ddp_accuracy") if accuracies else ()),
            "stalwart_kill_to_next_step_s", "ddp_kill_to_next_step_s",
            "stalwart_steps_repeated", "ddp_steps_repeated",
            "stalwart_bitwise_equal_to_fault_free", "ddp_bitwise_equal_to_fault_free",
            "load_average_1m", "run_dir")  # fmt: skip
    phases = {f"step ms: {k}": v for k, v in result["stalwart_step_ms"].items()}
    return {k: result[k] for k in keep} | phases


@app.command("exchange")
def bench_exchange(
    model_mib: int = typer.Option(64, min=4, help="float32 model size, MiB"),
    repeats: int = typer.Option(5, min=1, help="timed steps after one warm-up"),
    shard_groups: int = typer.Option(3, min=2, help="shard groups of the second measurement"),
    bf16_gradients: bool = typer.Option(
        False, "--bf16-gradients", help="push the gradients as bfloat16 (JobSpec.gradient_dtype)"
    ),
    output: Output = OUTPUT_OPTION,
) -> None:
    """One sync step's push + pull with 3 trainers vs a gloo all_reduce over 3 processes."""
    from stalwart.bench import exchange  # torch import is slow: only when asked

    with _status("all_reduce, then paramservers…", output):
        result = exchange.run(model_mib, repeats, shard_groups, bf16_gradients)
    emit_record(output, "sync exchange vs gloo all_reduce (same run)", result)
