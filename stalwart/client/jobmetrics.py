"""Reading a job's metric history (losses per step and slot, evaluations) from Python.

The history lives on the job's first shard group (ParamServerService.
ListJobMetrics); :class:`JobMetricsReader` finds it through the coordinator,
reads it page by page and follows it: :meth:`JobMetricsReader.new_records`
returns what was recorded since the last call. Each record is returned once,
even across a paramserver failover, whose new primary numbers its history
anew (docs/models.md, "Evaluation and metrics").
"""

from __future__ import annotations

import collections

import grpc

from stalwart.api import paramserver, paramserver_grpc
from stalwart.channel import open_channel
from stalwart.client.coordinator import CoordinatorClient
from stalwart.errors import ErrorKind, RpcError, StalwartError

PAGE_SIZE = 1000
# A replica that cannot answer now: ask the next one of the group.
_NEXT_REPLICA = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
# Keys of the records returned, for de-duplication after a failover: a replica
# keeps at most 20000 records per job, so remembering more than that is enough.
SEEN_KEYS = 50_000


def record_key(record: paramserver.MetricRecord) -> tuple:
    """What a record describes, the same on every replica."""
    if record.WhichOneof("record") == "loss":
        return ("loss", record.loss.step, record.loss.slot)
    return ("eval", record.evaluation.version)


class JobMetricsReader:
    """Follows one job's metric history; use as ``async with``.

    Asks the group's primary, then its backups (every replica keeps the history
    and answers ListJobMetrics whatever its role), through plain stubs: no torch.
    """

    def __init__(self, client: CoordinatorClient, job_id: str, call_timeout_s: float = 10.0):
        self.client = client
        self.job_id = job_id
        self.call_timeout_s = call_timeout_s
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._history_id = ""
        self._after = 0
        self._seen: collections.OrderedDict[tuple, None] = collections.OrderedDict()
        self.summary = paramserver.JobMetricsSummary()
        # no replica held the job at the last read: not registered yet, or (a job that
        # ended) its model and history released (--keep-finished-models)
        self.unheld = False

    async def __aenter__(self) -> JobMetricsReader:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()

    async def _addresses(self) -> list[str]:
        shard_map = await self.client.get_shard_map(self.job_id)  # NOT_FOUND: unknown job
        first = min(shard_map.groups, key=lambda g: g.shard, default=None)
        if first is None:
            raise StalwartError(ErrorKind.UNAVAILABLE, f"job {self.job_id} has no shard groups")
        return list(dict.fromkeys(a for a in [first.primary_address, *first.backup_addresses] if a))

    async def _list(self, request: paramserver.ListJobMetricsRequest):
        """One page; None while no replica holds the job yet (no trainer registered it)."""
        request.job_id = self.job_id
        last: RpcError | None = None
        for address in await self._addresses():
            if address not in self._channels:
                self._channels[address] = open_channel(address)
            stub = paramserver_grpc.ParamServerServiceStub(self._channels[address])
            try:
                return await stub.ListJobMetrics(request, timeout=self.call_timeout_s)
            except grpc.RpcError as exc:
                last = RpcError.from_grpc(exc)
                if last.kind is ErrorKind.UNKNOWN_JOB:
                    return None
                if last.code not in _NEXT_REPLICA:
                    raise last from None
        raise last or StalwartError(ErrorKind.UNAVAILABLE, f"no replica of {self.job_id} answered")

    async def read_summary(self) -> paramserver.JobMetricsSummary:
        """The latest loss and evaluation (empty while nothing is recorded)."""
        page = await self._list(paramserver.ListJobMetricsRequest(summary_only=True))
        return page.summary if page is not None else paramserver.JobMetricsSummary()

    async def new_records(self) -> list[paramserver.MetricRecord]:
        """Every record not returned before, oldest first.

        Pages by after_sequence rather than page tokens: a token names one
        replica's history, and the next page may come from another replica.
        """
        out: list[paramserver.MetricRecord] = []
        while True:
            request = paramserver.ListJobMetricsRequest(
                page_size=PAGE_SIZE, after_sequence=self._after
            )
            page = await self._list(request)
            self.unheld = page is None
            if page is None:
                return out
            if page.summary.history_id != self._history_id:
                first_read = not self._history_id
                self._history_id = page.summary.history_id
                if not first_read and self._after:  # another replica's: read it from the start
                    self._after = 0
                    continue
            self.summary = page.summary
            for record in page.records:
                self._after = max(self._after, record.sequence)
                key = record_key(record)
                if key not in self._seen:
                    self._seen[key] = None
                    if len(self._seen) > SEEN_KEYS:
                        self._seen.popitem(last=False)
                    out.append(record)
            if not page.next_page_token:
                return out
