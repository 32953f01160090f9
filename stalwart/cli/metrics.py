"""``stalwart job metrics JOB``: a job's training loss per step and slot, and its evaluations.

A table with one line per step (the slots' mean loss and each slot's) and one
per evaluation; ``-o json`` prints the records as a JSON list, or with
``--follow`` one JSON object a line as they come. ``--follow`` keeps reading
until the job ends (and its final evaluation, when it has ``eval_every``, is
in). ``--tensorboard DIR`` also writes the records as TensorBoard event files
(torch.utils.tensorboard's SummaryWriter): ``train/loss`` (mean over slots) and
``train/loss_slot_K`` at each step, ``eval/NAME`` at each evaluated version.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import typer
from rich.console import Console

from stalwart.api import coordinator, paramserver
from stalwart.cli.output import (
    OUTPUT_OPTION,
    Output,
    cli_errors,
    emit_json,
    emit_table,
    table_console,
)
from stalwart.cli.target import FROM_FLAGS, Target, option_groups
from stalwart.client.coordinator import FINISHED, CoordinatorClient
from stalwart.client.jobmetrics import JobMetricsReader

COLUMNS = ("kind", "step", "loss", "detail")
# After the job ends, how long --follow waits for the final evaluation (slot 0
# evaluates the last version after its last push is acknowledged).
FINAL_EVAL_WAIT_S = 60.0


def record_data(record: paramserver.MetricRecord) -> dict:
    when = record.time.ToDatetime().isoformat(timespec="milliseconds") + "Z"
    if record.WhichOneof("record") == "loss":
        r = record.loss
        return {"kind": "loss", "step": r.step, "slot": r.slot, "loss": r.loss, "time": when}
    e = record.evaluation
    return {"kind": "eval", "version": e.version, "metrics": dict(sorted(e.metrics.items())),
            "time": when}  # fmt: skip


def format_metrics(metrics) -> str:
    return "  ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items()))


class StepRows:
    """Losses grouped into one line per step, in step order; evaluations as they come."""

    def __init__(self, num_slots: int):
        self.num_slots = max(num_slots, 1)
        self.pending: dict[int, dict[int, float]] = {}

    def add(self, record: paramserver.MetricRecord) -> list[list]:
        """Lines complete with this record (a step once every slot reported)."""
        if record.WhichOneof("record") == "evaluation":
            e = record.evaluation
            return [["eval", e.version, "", format_metrics(e.metrics)]]
        slots = self.pending.setdefault(record.loss.step, {})
        slots[record.loss.slot] = record.loss.loss
        if len(slots) < self.num_slots:
            return []
        return [self._line(record.loss.step, self.pending.pop(record.loss.step))]

    def flush(self) -> list[list]:
        """Steps still missing a slot (the end of the data)."""
        steps, self.pending = sorted(self.pending.items()), {}
        return [self._line(step, slots) for step, slots in steps]

    @staticmethod
    def _line(step: int, slots: dict[int, float]) -> list:
        mean = sum(slots.values()) / len(slots)
        detail = "  ".join(f"{k}: {v:.4f}" for k, v in sorted(slots.items()))
        return ["loss", step, f"{mean:.4f}", detail]


def all_lines(records: list[paramserver.MetricRecord], num_slots: int) -> list[list]:
    rows = StepRows(num_slots)
    losses = sorted((r for r in records if r.WhichOneof("record") == "loss"),
                    key=lambda r: (r.loss.step, r.loss.slot))  # fmt: skip
    evals = sorted((r for r in records if r.WhichOneof("record") == "evaluation"),
                   key=lambda r: r.evaluation.version)  # fmt: skip
    lines = [line for r in losses for line in rows.add(r)] + rows.flush()
    lines += [line for r in evals for line in rows.add(r)]
    # an evaluation of version v sits before step v: it saw the weights step v starts from
    return sorted(lines, key=lambda line: (line[1], line[0] == "loss"))


class TensorBoard:
    """Records as TensorBoard scalars (the tensorboard package, through torch)."""

    def __init__(self, directory: Path):
        from torch.utils.tensorboard import SummaryWriter  # torch: only when asked

        self.writer = SummaryWriter(log_dir=str(directory))
        self.steps: dict[int, dict[int, float]] = {}
        self.num_slots = 1

    def add(self, record: paramserver.MetricRecord) -> None:
        if record.WhichOneof("record") == "evaluation":
            e = record.evaluation
            for name, value in sorted(e.metrics.items()):
                self.writer.add_scalar(f"eval/{name}", value, e.version)
            return
        r = record.loss
        self.writer.add_scalar(f"train/loss_slot_{r.slot}", r.loss, r.step)
        slots = self.steps.setdefault(r.step, {})
        slots[r.slot] = r.loss
        if len(slots) >= self.num_slots:
            self._mean(r.step, self.steps.pop(r.step))

    def _mean(self, step: int, slots: dict[int, float]) -> None:
        self.writer.add_scalar("train/loss", sum(slots.values()) / len(slots), step)

    def close(self) -> None:
        for step, slots in sorted(self.steps.items()):
            self._mean(step, slots)
        self.writer.close()


async def follow(
    client: CoordinatorClient, job_id: str, interval: float,
    on_records: Callable[[list[paramserver.MetricRecord]], None],
) -> coordinator.Job:  # fmt: skip
    """Hand new records to ``on_records`` until the job ends (and its final evaluation
    is in, or ``FINAL_EVAL_WAIT_S`` passed); returns the finished job."""
    async with JobMetricsReader(client, job_id) as reader:
        ended_at = None
        while True:
            job = await client.get_job(job_id)
            records = await reader.new_records()
            on_records(records)
            if job.state in FINISHED:
                ended_at = ended_at or time.monotonic()
                last = reader.summary.last_evaluation
                waiting = job.spec.eval_every > 0 and job.state == coordinator.JOB_STATE_SUCCEEDED
                if not waiting or last.version >= job.spec.steps:
                    return job
                if time.monotonic() - ended_at > FINAL_EVAL_WAIT_S:
                    return job
            await asyncio.sleep(interval)


async def read_all(client: CoordinatorClient, job_id: str):
    job = await client.get_job(job_id)  # NOT_FOUND for an unknown job
    async with JobMetricsReader(client, job_id) as reader:
        records = await reader.new_records()
        return job, records, reader.unheld


@cli_errors
@option_groups
def metrics(
    job_id: str = typer.Argument(..., help="job id"),
    follow_: bool = typer.Option(False, "--follow", "-f", help="print new rows until the job ends"),
    tensorboard: Path | None = typer.Option(None, "--tensorboard", help="also write TensorBoard event files into this folder"),
    interval: float = typer.Option(1.0, "--interval", min=0.1, help="--follow: seconds between reads"),
    output: Output = OUTPUT_OPTION,
    cluster: Target = FROM_FLAGS,
) -> None:  # fmt: skip
    """A job's training loss per step and slot, and its evaluations."""
    board = TensorBoard(tensorboard) if tensorboard is not None else None
    try:
        if follow_:
            _follow(cluster, job_id, interval, output, board)
            return
        job, records, unheld = cluster.call(lambda c: read_all(c, job_id))
        for r in records:
            if board is not None:
                board.num_slots = max(job.spec.num_slots, 1)
                board.add(r)
        if output is Output.json:
            emit_json([record_data(r) for r in records])
        else:
            emit_table(f"metrics of {job_id}", COLUMNS, all_lines(records, job.spec.num_slots))
            if unheld and job.state in FINISHED:
                Console(stderr=True).print(
                    f"(no rows: job {job_id} has ended and its paramservers no longer hold "
                    "its history; they keep the jobs that ended last, --keep-finished-models)"
                )
    finally:
        if board is not None:
            board.close()


def _follow(cluster: Target, job_id: str, interval: float, output: Output, board) -> None:
    console = table_console()
    state: dict = {}

    def on_records(records: list[paramserver.MetricRecord]) -> None:
        rows = state["rows"]
        for r in records:
            if board is not None:
                board.add(r)
            if output is Output.json:
                print(json.dumps(record_data(r)), flush=True)
                continue
            for line in rows.add(r):
                console.print("  ".join(str(v) for v in line if v != ""))

    async def go(client: CoordinatorClient) -> coordinator.Job:
        job = await client.get_job(job_id)
        state["rows"] = StepRows(job.spec.num_slots)
        if board is not None:
            board.num_slots = max(job.spec.num_slots, 1)
        if output is Output.table:
            console.print("  ".join(COLUMNS))
        return await follow(client, job_id, interval, on_records)

    cluster.call(go)
    if output is Output.table:
        for line in state["rows"].flush():
            console.print("  ".join(str(v) for v in line if v != ""))
