"""The paramserver's side of a job's metrics: what pushes and evaluations report.

Every replica keeps a :class:`~services.paramserver.history.History` per job:
losses come with the pushes it stages (a backup gets them in the forwarded push
header), evaluations with RecordEvaluation (the primary forwards each to its
backups). ListJobMetrics reads a replica's own history; the per-job Prometheus
series are exported by primaries only, so a group shows each value once.
The servicer calls in here (as it does services/paramserver/checkpointing.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from google.protobuf import timestamp_pb2
from prometheus_client.core import GaugeMetricFamily

from services.paramserver import history
from stalwart import paging
from stalwart.api import paramserver
from stalwart.errors import ErrorKind, StalwartError

if TYPE_CHECKING:
    from services.paramserver.servicer import ParamServer

# The per-job Prometheus series cover at most this many jobs on a replica (the
# ones with the newest records), so the `job` label stays bounded.
MAX_EXPORTED_JOBS = 20


class Histories:
    """Each job's metric history on this replica."""

    def __init__(self, max_records: int = history.MAX_RECORDS):
        self.max_records = max_records
        self.jobs: dict[str, history.History] = {}

    def of(self, job_id: str) -> history.History:
        h = self.jobs.get(job_id)
        if h is None:
            h = self.jobs[job_id] = history.History(self.max_records)
        return h

    def on_push(self, header: paramserver.PushHeader) -> None:
        """A push was staged: keep its slot's loss, when it reports one."""
        if header.HasField("loss"):
            self.of(header.job_id).record_loss(header.step, header.slot, header.loss)


# --- RecordEvaluation ------------------------------------------------------------


async def record(ps: ParamServer, request: paramserver.RecordEvaluationRequest):
    """RecordEvaluation: checked, kept here, and (on a primary) forwarded to the backups."""
    from services.paramserver.replica import Role

    primary = ps.replica.role is Role.PRIMARY and not request.from_primary
    if request.from_primary:
        ps._from_primary(request.epoch)
    else:
        ps._client(request.epoch)  # NOT_PRIMARY on a backup
    if request.job_id not in ps.jobs:
        ps._job(request.job_id)  # UNKNOWN_JOB
    evaluation = request.evaluation
    problem = history.check_evaluation(evaluation.version, dict(evaluation.metrics))
    if problem:
        raise StalwartError(ErrorKind.INVALID_ARGUMENT, f"evaluation: {problem}")
    kept = ps.histories.of(request.job_id).record_evaluation(
        evaluation.version, dict(evaluation.metrics)
    )
    if primary:
        await ps.replicator.forward_evaluation(request)
    return paramserver.RecordEvaluationResponse(duplicate=not kept)


# --- ListJobMetrics ----------------------------------------------------------------


def list_metrics(ps: ParamServer, request: paramserver.ListJobMetricsRequest):
    """ListJobMetrics from this replica's history (any role answers)."""
    h = ps.histories.jobs.get(request.job_id)
    if h is None:
        ps._job(request.job_id)  # UNKNOWN_JOB unless the model is here
        h = ps.histories.of(request.job_id)
    if request.page_size < 0:
        raise StalwartError(ErrorKind.INVALID_ARGUMENT, "page_size must be >= 0")
    if request.after_sequence < 0:
        raise StalwartError(ErrorKind.INVALID_ARGUMENT, "after_sequence must be >= 0")
    response = paramserver.ListJobMetricsResponse(summary=_summary(h.summary()))
    if request.summary_only:
        return response
    after = request.after_sequence
    if request.page_token:
        key = paging.decode(request.page_token)
        if len(key) != 2 or key[0] != h.history_id or not isinstance(key[1], int):
            raise StalwartError(
                ErrorKind.INVALID_ARGUMENT, "bad page_token (or the history started anew)"
            )
        after = max(after, key[1])
    size = min(request.page_size or paging.DEFAULT_PAGE_SIZE, paging.MAX_PAGE_SIZE)
    records, more = h.after(after, size)
    response.records.extend(_record(r) for r in records)
    if more:
        response.next_page_token = paging.encode([h.history_id, records[-1].sequence])
    return response


def _record(r: history.Record) -> paramserver.MetricRecord:
    when = timestamp_pb2.Timestamp()
    when.FromNanoseconds(int(r.time * 1e9))
    out = paramserver.MetricRecord(sequence=r.sequence, time=when)
    if r.kind == history.LOSS:
        out.loss.CopyFrom(paramserver.TrainingLoss(step=r.step, slot=r.slot, loss=r.loss))
    else:
        out.evaluation.CopyFrom(_evaluation(r))
    return out


def _evaluation(r: history.Record) -> paramserver.Evaluation:
    return paramserver.Evaluation(version=r.step, metrics=dict(r.metrics))


def _summary(s: history.Summary) -> paramserver.JobMetricsSummary:
    out = paramserver.JobMetricsSummary(
        history_id=s.history_id, last_sequence=s.last_sequence, latest_step=s.latest_step,
        latest_loss=s.latest_loss, loss_slots=s.loss_slots, dropped=s.dropped,
    )  # fmt: skip
    if s.last_evaluation is not None:
        out.last_evaluation.CopyFrom(_evaluation(s.last_evaluation))
    return out


# --- Prometheus --------------------------------------------------------------------


class JobSeries:
    """Per-job gauges read at every scrape, on primaries only (a custom collector).

    Labels are bounded: ``job`` by :data:`MAX_EXPORTED_JOBS`, ``metric`` by the
    16 names an evaluation may carry. Jobs are never named by a step.
    """

    def __init__(self, ps: ParamServer):
        self.ps = ps

    def collect(self):
        from services.paramserver.replica import Role

        loss = GaugeMetricFamily(
            "stalwart_job_train_loss",
            "Mean training loss the slots reported for the job's latest step.",
            labels=["job"],
        )
        step = GaugeMetricFamily(
            "stalwart_job_train_step", "Latest step any slot reported a loss for.", labels=["job"]
        )
        value = GaugeMetricFamily(
            "stalwart_job_eval_value", "The job's last evaluation, one series per metric.",
            labels=["job", "metric"],
        )  # fmt: skip
        version = GaugeMetricFamily(
            "stalwart_job_eval_version", "Version of the job's last evaluation.", labels=["job"]
        )
        if self.ps.replica.role is Role.PRIMARY:
            for job_id, s in exported(self.ps.histories):
                if s.loss_slots:
                    loss.add_metric([job_id], s.latest_loss)
                    step.add_metric([job_id], s.latest_step)
                if s.last_evaluation is not None:
                    version.add_metric([job_id], s.last_evaluation.step)
                    for name, v in s.last_evaluation.metrics:
                        value.add_metric([job_id, name], v)
        return [loss, step, value, version]


def exported(histories: Histories) -> list[tuple[str, history.Summary]]:
    """The jobs whose series are exported: those with the newest records, at most
    :data:`MAX_EXPORTED_JOBS` (copied first: the scrape runs on another thread)."""
    summaries = [(j, h.summary()) for j, h in list(histories.jobs.items()) if len(h)]
    newest = sorted(summaries, key=lambda js: _last_time(histories.jobs[js[0]]), reverse=True)
    return newest[:MAX_EXPORTED_JOBS]


def _last_time(h: history.History) -> float:
    last = h.last()
    return last.time if last is not None else 0.0
