"""JobMetricsReader: each record once, across pages and across a change of replica."""

from __future__ import annotations

import asyncio

from services.paramserver import jobmetrics
from services.paramserver.history import History
from stalwart.api import paramserver
from stalwart.client.jobmetrics import JobMetricsReader


class Replicas(JobMetricsReader):
    """Answers from in-memory histories; ``serving`` says which one answers."""

    def __init__(self, histories: dict[str, History]):
        super().__init__(client=None, job_id="j")
        self.histories = histories
        self.serving = next(iter(histories))

    async def _list(self, request):
        h = self.histories[self.serving]
        size = request.page_size or 100
        records, more = h.after(request.after_sequence, size)
        page = paramserver.ListJobMetricsResponse(summary=jobmetrics._summary(h.summary()))
        page.records.extend(jobmetrics._record(r) for r in records)
        page.next_page_token = "more" if more else ""
        return page


def keys(records):
    return [(r.loss.step, r.loss.slot) for r in records]


def test_pages_and_a_failover_return_each_record_once(monkeypatch):
    monkeypatch.setattr("stalwart.client.jobmetrics.PAGE_SIZE", 3)
    primary, backup = History(), History()
    for step in range(4):  # the backup saw the same pushes
        for h in (primary, backup):
            h.record_loss(step, 0, float(step))
    reader = Replicas({"primary": primary, "backup": backup})
    assert keys(asyncio.run(reader.new_records())) == [(s, 0) for s in range(4)]
    assert asyncio.run(reader.new_records()) == []
    backup.record_loss(4, 0, 4.0)  # the primary died; the promoted backup goes on
    reader.serving = "backup"
    assert keys(asyncio.run(reader.new_records())) == [(4, 0)]
    assert reader.summary.latest_step == 4
