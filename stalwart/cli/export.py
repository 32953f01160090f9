"""``stalwart job export JOB -o FILE``: a job's current weights as a file.

Pulls every parameter and buffer from the job's shard groups at one version
they all agree on (the latest, or at least ``--min-version``) and writes them
under the model's own names, so ``model.load_state_dict(load_file(FILE))``
restores the trained model and ``--init-from FILE`` starts a job from it.
The task is resolved here to learn the tensor shapes: a user model must be
importable on this machine too.
"""

from __future__ import annotations

from pathlib import Path

import typer

from stalwart.cli.output import ExitCode, Output, cli_errors, emit_record, fail
from stalwart.cli.target import FROM_FLAGS, Target, option_groups
from stalwart.client.coordinator import CoordinatorClient

# -o names the file here (``job export JOB -o model.safetensors``); the report's
# format keeps its long name only.
_OUTPUT = typer.Option(Output.table, "--output", help="table for people, json for scripts")


async def fetch(client: CoordinatorClient, job_id: str, min_version: int):
    """(job, version, tensors) of ``job_id`` pulled from its paramservers."""
    from stalwart.demo.watch import param_client, pull_weights  # torch: only when exporting

    job = await client.get_job(job_id)
    ps = await param_client(client, job_id, job.spec)
    try:
        version, tensors = await pull_weights(ps, job_id, min_version)
    finally:
        await ps.close()
    return job, version, tensors


@cli_errors
@option_groups
def export(
    job_id: str = typer.Argument(..., help="job id"),
    out: Path = typer.Option(..., "--file", "-o", help="file to write, e.g. model.safetensors"),
    fmt: str = typer.Option("safetensors", "--format", help="safetensors or torch (torch.save of a dict)"),
    min_version: int = typer.Option(0, min=0, help="wait until the job reaches this version"),
    output: Output = _OUTPUT,
    cluster: Target = FROM_FLAGS,
) -> None:  # fmt: skip
    """Write a job's weights (parameters and buffers) at its latest version to a file."""
    from stalwart import weights

    if fmt not in weights.FORMATS:
        fail(f"--format must be one of {', '.join(weights.FORMATS)}", ExitCode.INVALID_INPUT)
    job, version, tensors = cluster.call(lambda c: fetch(c, job_id, min_version))
    size = weights.save(tensors, out, fmt)
    record = {"job": job.job_id, "version": version, "file": str(out), "format": fmt,
              "tensors": len(tensors), "bytes": size}  # fmt: skip
    emit_record(output, f"exported {job.job_id}", record)
