"""ListJobMetrics pages and the per-job Prometheus series, over a stand-in servicer."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from services.paramserver import jobmetrics
from services.paramserver.replica import Role
from stalwart.api import paramserver
from stalwart.errors import StalwartError


def servicer(role=Role.PRIMARY) -> SimpleNamespace:
    ps = SimpleNamespace(
        jobs={}, histories=jobmetrics.Histories(), replica=SimpleNamespace(role=role)
    )

    def unknown(job_id):
        raise StalwartError(jobmetrics.ErrorKind.UNKNOWN_JOB, f"no model for {job_id}")

    ps._job = unknown
    return ps


def push(job_id, step, slot, loss):
    return paramserver.PushHeader(job_id=job_id, step=step, slot=slot, loss=loss)


def test_pages_follow_the_token_and_after_sequence():
    ps = servicer()
    for step in range(5):
        for slot in range(2):
            ps.histories.on_push(push("j", step, slot, step + slot / 10))
    ps.histories.on_push(paramserver.PushHeader(job_id="j", step=9, slot=0))  # no loss: nothing
    first = jobmetrics.list_metrics(ps, paramserver.ListJobMetricsRequest(job_id="j", page_size=4))
    assert [r.sequence for r in first.records] == [1, 2, 3, 4] and first.next_page_token
    rest = jobmetrics.list_metrics(
        ps,
        paramserver.ListJobMetricsRequest(
            job_id="j", page_size=100, page_token=first.next_page_token
        ),
    )
    assert [(r.loss.step, r.loss.slot) for r in rest.records][0] == (2, 0)
    assert len(rest.records) == 6 and not rest.next_page_token
    newer = jobmetrics.list_metrics(
        ps, paramserver.ListJobMetricsRequest(job_id="j", after_sequence=8)
    )
    assert [r.sequence for r in newer.records] == [9, 10]
    s = newer.summary
    assert (s.latest_step, s.loss_slots, s.last_sequence) == (4, 2, 10)
    assert s.latest_loss == pytest.approx(4.05)


def test_unknown_job_and_bad_tokens_are_refused():
    ps = servicer()
    with pytest.raises(StalwartError, match="no model"):
        jobmetrics.list_metrics(ps, paramserver.ListJobMetricsRequest(job_id="nope"))
    ps.histories.on_push(push("j", 0, 0, 1.0))
    for bad in (dict(page_token="zz"), dict(page_size=-1), dict(after_sequence=-2)):
        with pytest.raises(StalwartError) as err:
            jobmetrics.list_metrics(ps, paramserver.ListJobMetricsRequest(job_id="j", **bad))
        assert err.value.kind is jobmetrics.ErrorKind.INVALID_ARGUMENT


def test_series_on_primaries_only_and_for_a_bounded_set_of_jobs():
    ps = servicer()
    for i in range(jobmetrics.MAX_EXPORTED_JOBS + 5):
        ps.histories.on_push(push(f"job{i}", 3, 0, float(i)))
    ps.histories.of("job0").record_evaluation(10, {"accuracy": 0.5, "loss": 0.25})
    families = {f.name: f for f in jobmetrics.JobSeries(ps).collect()}
    jobs = {s.labels["job"] for s in families["stalwart_job_train_loss"].samples}
    assert len(jobs) == jobmetrics.MAX_EXPORTED_JOBS
    evals = {s.labels["metric"]: s.value for s in families["stalwart_job_eval_value"].samples}
    assert evals == {"accuracy": 0.5, "loss": 0.25}  # job0's record is the newest
    ps.replica.role = Role.BACKUP
    assert all(not f.samples for f in jobmetrics.JobSeries(ps).collect())
