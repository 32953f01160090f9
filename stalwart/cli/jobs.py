"""``stalwart jobs`` and ``stalwart job submit | get | cancel``."""

from __future__ import annotations

import asyncio
import enum
import time

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from stalwart import jobspec
from stalwart.api import common, coordinator
from stalwart.cli import export as export_cmd
from stalwart.cli import metrics as metrics_cmd
from stalwart.cli import resume as resume_cmd
from stalwart.cli.admin import JOB_COLUMNS, enum_name, job_row
from stalwart.cli.output import (
    OUTPUT_OPTION,
    ExitCode,
    Output,
    cli_errors,
    emit_record,
    emit_rows,
    fail,
)
from stalwart.cli.target import FROM_FLAGS, Target, option_groups
from stalwart.cli.trainflags import TrainingFlags, describe_rule
from stalwart.client.coordinator import FINISHED, CoordinatorClient

app = typer.Typer(help="Submit, inspect, cancel and export training jobs.", no_args_is_help=True)
app.command("export")(export_cmd.export)
app.command("metrics")(metrics_cmd.metrics)
app.command("resume")(resume_cmd.resume)

# The coordinator's defaults (stalwart.jobspec), shown and sent by `job submit`.
# That module imports no torch, so submitting a job stays fast.
BUILTIN_DEFAULTS: dict[str, dict] = {k: dict(v) for k, v in jobspec.MODEL_DEFAULTS.items()}
FALLBACK = jobspec.FALLBACK_DEFAULTS


class OptimizerName(enum.StrEnum):
    sgd = "sgd"
    adam = "adam"
    adamw = "adamw"


class Mode(enum.StrEnum):
    sync = "sync"
    async_ = "async"
    ssp = "ssp"


_OPTIMIZERS = jobspec.OPTIMIZER_KINDS
_MODES = {
    "sync": common.CONSISTENCY_MODE_SYNC,
    "async": common.CONSISTENCY_MODE_ASYNC,
    "ssp": common.CONSISTENCY_MODE_SSP,
}


def parse_model_args(args: list[str]) -> dict[str, str]:
    """``--arg key=value`` flags as a dict (exit 2 on one without ``=`` or key)."""
    out = {}
    for item in args:
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail(f"--arg {item!r}: expected key=value", ExitCode.INVALID_INPUT)
        out[key] = value
    return out


INT32_MAX, INT64_MAX = 2**31 - 1, 2**63 - 1


def build_spec(
    model: str,
    slots: int | None,
    steps: int | None,
    batch_size: int | None,
    seed: int,
    optimizer: str | None,
    lr: float | None,
    momentum: float,
    weight_decay: float | None,
    mode: str,
    staleness: int,
    shards: int,
    args: list[str],
) -> coordinator.JobSpec:
    """A JobSpec from the flags, the model's defaults filling what was not given.

    Only the shape of the input is checked here (``--arg`` is key=value); the
    coordinator validates the spec and answers INVALID_ARGUMENT with a reason.
    """
    counts = {"--slots": slots, "--steps": steps, "--batch-size": batch_size, "--shards": shards}
    for flag, value in counts.items():
        if value == 0:  # 0 on the wire is "the default": a 400-step job for --steps 0
            fail(f"{flag} 0: give 1 or more, or leave it out for the model's default",
                 ExitCode.INVALID_INPUT)  # fmt: skip
        largest = INT64_MAX if flag == "--steps" else INT32_MAX  # what the JobSpec field holds
        if value is not None and value > largest:
            fail(f"{flag} {value}: at most {largest:,}", ExitCode.INVALID_INPUT)
    if lr == 0:  # likewise: lr 0 on the wire is the model's rate, not "no updates"
        fail("--lr 0: give a rate above 0, or leave it out for the model's default",
             ExitCode.INVALID_INPUT)  # fmt: skip
    defaults = BUILTIN_DEFAULTS.get(model, FALLBACK)
    model_args = parse_model_args(args)
    spec = coordinator.JobSpec()
    spec.CopyFrom(jobspec.model_extras(model, shards or 1))
    spec.MergeFrom(coordinator.JobSpec(
        model=model,
        model_args=model_args,
        num_slots=defaults["slots"] if slots is None else slots,
        steps=defaults["steps"] if steps is None else steps,
        batch_size=defaults["batch_size"] if batch_size is None else batch_size,
        seed=seed,
        num_shards=shards,
        optimizer=common.OptimizerSpec(
            kind=_OPTIMIZERS[optimizer or defaults["optimizer"]],
            lr=defaults["lr"] if lr is None else lr,
            momentum=momentum,
        ),
        consistency=common.ConsistencySpec(mode=_MODES[mode], staleness=staleness),
    ))  # fmt: skip
    if weight_decay is not None:
        spec.optimizer.weight_decay = weight_decay
    return spec


def job_details(job: coordinator.Job) -> dict:
    spec = job.spec
    return {
        "job": job.job_id,
        "state": enum_name(coordinator.JobState, job.state, "JOB_STATE_"),
        "reason": job.reason,
        "step": f"{job.step}/{spec.steps}",
        "model": spec.model + (f" {dict(spec.model_args)}" if spec.model_args else ""),
        "slots": ", ".join(f"{s.slot}:{s.node_id or '-'}" for s in job.slots)
        or str(spec.num_slots),
        "batch size": spec.batch_size,
        "seed": spec.seed,
        "optimizer": f"{enum_name(common.OptimizerKind, spec.optimizer.kind, 'OPTIMIZER_KIND_')}"
        f" lr={spec.optimizer.lr:g}{describe_rule(spec)}",
        "mode": enum_name(common.ConsistencyMode, spec.consistency.mode, "CONSISTENCY_MODE_"),
        "created": job.create_time.ToDatetime().isoformat(timespec="seconds") + "Z",
    }


async def wait_for(
    client: CoordinatorClient, job: coordinator.Job, timeout_s: float, show: bool
) -> coordinator.Job:
    """Poll the job until it finishes (a progress bar on stderr when ``show``)."""
    deadline = time.monotonic() + timeout_s
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("steps"), TimeElapsedColumn(),
        console=Console(stderr=True), disable=not show, transient=False,
    )  # fmt: skip
    with progress:  # closed before the error line, so the bar's last draw sits above it
        bar = progress.add_task(job.job_id, total=job.spec.steps)
        while job.state not in FINISHED and time.monotonic() <= deadline:
            await asyncio.sleep(0.5)
            job = await client.get_job(job.job_id)
            state = enum_name(coordinator.JobState, job.state, "JOB_STATE_")
            progress.update(bar, completed=job.step, description=f"{job.job_id} {state}")
    if job.state not in FINISHED:
        state = enum_name(coordinator.JobState, job.state, "JOB_STATE_")
        fail(f"job {job.job_id} still {state} at step {job.step} after {timeout_s:.0f}s",
             ExitCode.FAILED)  # fmt: skip
    return job


@app.command()
@cli_errors
@option_groups
def submit(
    model: str = typer.Option("digits-cnn", help="built-in (digits-cnn, mlp, embedding, char-lm) or package.module:function"),
    slots: int | None = typer.Option(None, help="data-parallel slots (trainers); default per model"),
    steps: int | None = typer.Option(None, help="steps to train; default per model"),
    batch_size: int | None = typer.Option(None, help="examples per slot per step; default per model"),
    seed: int = typer.Option(0, min=0, help="seeds weights and every batch: same seed, same run"),
    optimizer: OptimizerName | None = typer.Option(None, help="default per model"),
    lr: float | None = typer.Option(None, help="learning rate; default per model"),
    momentum: float = typer.Option(0.0, help="SGD momentum"),
    weight_decay: float | None = typer.Option(None, help="weight decay; default per model (0 but char-lm)"),
    mode: Mode = typer.Option(Mode.sync, help="consistency: sync (bitwise reproducible), async, ssp (these two on one shard group)"),
    staleness: int = typer.Option(0, help="SSP: most versions a push may lag"),
    shards: int = typer.Option(1, help="paramserver shard groups the job uses"),
    rule: TrainingFlags = FROM_FLAGS,
    arg: list[str] = typer.Option([], "--arg", help="model argument key=value (repeat), e.g. width=8"),
    job_id: str = typer.Option("", help="job id; default: generated"),
    wait: bool = typer.Option(False, "--wait", help="follow the job with a progress bar until it ends"),
    wait_timeout: float = typer.Option(3600.0, min=1, help="longest --wait, seconds"),
    output: Output = OUTPUT_OPTION,
    cluster: Target = FROM_FLAGS,
) -> None:  # fmt: skip
    """Submit a training job; with --wait, follow it to the end (exit 1 unless it succeeds)."""
    spec = build_spec(model, slots, steps, batch_size, seed, optimizer, lr, momentum,
                      weight_decay, mode.value, staleness, shards, arg)  # fmt: skip
    rule.apply(spec)

    async def go(client: CoordinatorClient) -> coordinator.Job:
        job = await client.create_job(spec, job_id=job_id)
        if not wait:
            return job
        if output is Output.table:
            Console(stderr=True).print(f"submitted {job.job_id}")
        return await wait_for(client, job, wait_timeout, show=output is Output.table)

    job = cluster.call(go)
    emit_record(output, f"job {job.job_id}", job, job_details)
    if wait and job.state != coordinator.JOB_STATE_SUCCEEDED:
        raise typer.Exit(int(ExitCode.FAILED))


@app.command()
@cli_errors
@option_groups
def get(
    job_id: str = typer.Argument(..., help="job id"),
    output: Output = OUTPUT_OPTION,
    cluster: Target = FROM_FLAGS,
) -> None:
    """One job: state, step, who holds each slot, its spec."""
    job = cluster.call(lambda c: c.get_job(job_id))
    emit_record(output, f"job {job.job_id}", job, job_details)


app.command("status", help="One job: state and reason, step, slots, spec (same as get).")(get)


@app.command()
@cli_errors
@option_groups
def cancel(
    job_id: str = typer.Argument(..., help="job id"),
    reason: str = typer.Option("cancelled from the CLI", help="recorded as the job's reason"),
    output: Output = OUTPUT_OPTION,
    cluster: Target = FROM_FLAGS,
) -> None:
    """Cancel a job (a finished job is left as it is)."""
    job = cluster.call(lambda c: c.cancel_job(job_id, reason))
    emit_record(output, f"job {job.job_id}", job, job_details)


@cli_errors
@option_groups
def jobs(output: Output = OUTPUT_OPTION, cluster: Target = FROM_FLAGS) -> None:
    """Every job, newest first."""
    emit_rows(output, "jobs", JOB_COLUMNS, cluster.call(lambda c: c.all_jobs()), job_row)
