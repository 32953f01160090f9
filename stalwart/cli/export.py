"""``stalwart job export JOB -o FILE``: a job's weights (and optimizer state) as files.

By default the latest version, pulled from the job's shard groups at one version
they all agree on (``--min-version`` waits for one); ``--version N`` exactly
version N (the job's checkpoint at step N, or the live state when the job stands
there); ``--checkpoint ID`` what a checkpoint holds, read and verified from the
checkpoint store. Weights go under the model's own names, so
``model.load_state_dict(load_file(FILE))`` restores the trained model and
``--init-from FILE`` starts a job from it; ``--optimizer-state FILE2`` writes the
optimizer's tensors beside it (stalwart.exporting). The task is resolved here to
learn the tensor shapes: a user model must be importable on this machine too.
"""

from __future__ import annotations

from pathlib import Path

import typer

from stalwart.cli.output import (
    ExitCode,
    Output,
    check_output_file,
    cli_errors,
    emit_record,
    fail,
)
from stalwart.cli.target import FROM_FLAGS, Target, option_groups
from stalwart.client.coordinator import CoordinatorClient

# -o names the file here (``job export JOB -o model.safetensors``); the report's
# format keeps its long name only.
_OUTPUT = typer.Option(Output.table, "--output", help="table for people, json for scripts")
# stalwart.weights.FORMATS, known here without importing torch (bad flags answer at once)
FORMATS = ("safetensors", "torch")


async def fetch(
    client: CoordinatorClient,
    job_id: str,
    min_version: int,
    version: int | None,
    checkpoint_id: str,
    optimizer_state: bool,
    store_url: str,
):
    """The :class:`stalwart.exporting.Exported` the flags ask for."""
    from stalwart import exporting  # torch: only when exporting

    if checkpoint_id:
        manifest = await client.get_checkpoint(checkpoint_id)
        if manifest.job_id != job_id:
            fail(f"checkpoint {checkpoint_id} belongs to job {manifest.job_id}, not {job_id}",
                 ExitCode.INVALID_INPUT)  # fmt: skip
        job = await client.get_job(job_id)
        return exporting.read_checkpoint(manifest, job.spec, store_url)
    if version is not None:
        return await exporting.at_version(client, job_id, version, optimizer_state, store_url)
    return await exporting.pull_live(client, job_id, min_version, optimizer_state)


@cli_errors
@option_groups
def export(
    job_id: str = typer.Argument(..., help="job id"),
    out: Path = typer.Option(..., "--file", "-o", help="file to write, e.g. model.safetensors"),
    fmt: str = typer.Option("safetensors", "--format", help="safetensors or torch (torch.save of a dict)"),
    optimizer_state: Path | None = typer.Option(None, "--optimizer-state", help="also write the optimizer state to this file (same format)"),
    min_version: int = typer.Option(0, min=0, help="wait until the job reaches this version"),
    version: int | None = typer.Option(None, min=0, help="exactly this version: the job's checkpoint at that step, or the live state if the job is there"),
    checkpoint: str = typer.Option("", "--checkpoint", help="export what this checkpoint holds (see `stalwart ckpt list`)"),
    store_url: str = typer.Option("", "--store-url", help="read checkpoints from this store; default: the one the manifest names"),
    output: Output = _OUTPUT,
    cluster: Target = FROM_FLAGS,
) -> None:  # fmt: skip
    """Write a job's weights (parameters and buffers), and on request its optimizer state."""
    if fmt not in FORMATS:
        fail(f"--format must be one of {', '.join(FORMATS)}", ExitCode.INVALID_INPUT)
    if out.name in {o.value for o in Output}:  # `-o json` as on the other commands
        fail(f"-o is --file here (the file to write), not {out.name!r}: for JSON give "
             "--output json", ExitCode.INVALID_INPUT)  # fmt: skip
    if checkpoint and (version is not None or min_version):
        fail("--checkpoint fixes the version: leave out --version and --min-version",
             ExitCode.INVALID_INPUT)  # fmt: skip
    if version is not None and min_version:
        fail("give --version or --min-version, not both", ExitCode.INVALID_INPUT)
    check_output_file(out, "-o/--file")
    if optimizer_state is not None:
        check_output_file(optimizer_state, "--optimizer-state")
        if optimizer_state.resolve() == out.resolve():
            fail("--optimizer-state must name another file than -o", ExitCode.INVALID_INPUT)
    from stalwart import exporting

    got = cluster.call(lambda c: fetch(c, job_id, min_version, version, checkpoint,
                                       optimizer_state is not None, store_url))  # fmt: skip
    size = exporting.save(got, out, fmt, optimizer_state)
    record = {"job": got.job_id, "version": got.version, "source": got.source, "file": str(out),
              "format": fmt, "tensors": len(got.weights), "bytes": size}  # fmt: skip
    if optimizer_state is not None:
        record["optimizer_file"] = str(optimizer_state)
        record["optimizer_tensors"] = len(got.optimizer)
    emit_record(output, f"exported {got.job_id}", record)
