"""gRPC adapter of the health service: validate, stamp time, call the Fleet, publish.

Decisions live in fleet.py / rules.py / online.py; this file only moves data.
Time is the receiver's wall clock (time.time()), not the sender's: windows and
trends then never depend on a node's clock being right.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time

import structlog
from google.protobuf.timestamp_pb2 import Timestamp
from prometheus_client import Counter, Gauge

from services.health.alerts import AlertLog
from services.health.fleet import Assessment, Fleet, FleetFull
from services.health.settings import HealthSettings
from stalwart import limits, paging
from stalwart.api import health, health_grpc
from stalwart.errors import ErrorKind, StalwartError
from stalwart.server import rpc_handler

log = structlog.get_logger(__name__)

SAMPLES = Counter("stalwart_health_samples_total", "Telemetry samples received.", ["result"])
ALERTS = Counter("stalwart_health_alerts_total", "Alerts raised.", ["kind"])
# One series per node: bounded by cluster membership, like every per-node view.
RISK = Gauge("stalwart_health_risk_score", "Predicted failure risk in [0, 1].", ["node"])
ANOMALY = Gauge(
    "stalwart_health_anomaly_score", "Anomaly score of the latest telemetry window.", ["node"]
)
DRAIN_REQUESTS = Counter("stalwart_health_drain_requests_total", "Alerts that ask for a drain.")

KINDS = {
    "anomaly": health.ALERT_KIND_ANOMALY,
    "predicted_failure": health.ALERT_KIND_PREDICTED_FAILURE,
    "data_corruption": health.ALERT_KIND_DATA_CORRUPTION,
    "straggler": health.ALERT_KIND_STRAGGLER,
}
KIND_NAMES = {v: k for k, v in KINDS.items()}


def _ts(seconds: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


def check_sample(sample, max_metrics: int) -> None:
    """INVALID_ARGUMENT / LIMIT_EXCEEDED for a sample the fleet must not see."""
    if not sample.node_id or len(sample.node_id) > 128:
        raise StalwartError(ErrorKind.INVALID_ARGUMENT, "sample.node_id (1-128 chars) is required")
    if len(sample.metrics) > max_metrics:
        raise StalwartError(
            ErrorKind.LIMIT_EXCEEDED,
            f"{len(sample.metrics)} metrics in one sample; at most {max_metrics}",
        )
    for name, value in sample.metrics.items():
        if not name or len(name) > 128:
            raise StalwartError(ErrorKind.INVALID_ARGUMENT, "metric names are 1-128 chars")
        if not math.isfinite(value):
            raise StalwartError(ErrorKind.INVALID_ARGUMENT, f"metric {name!r} is not finite")


def risk_proto(a: Assessment) -> health.NodeRisk:
    risk = health.NodeRisk(node_id=a.node_id, risk=a.risk, anomaly_score=a.anomaly,
                           top_signals=list(a.top_signals), update_time=_ts(a.time),
                           reasons=list(a.reasons))  # fmt: skip
    if a.lead_s is not None:  # unset: no rule predicts a failure
        risk.predicted_lead_time.FromNanoseconds(int(a.lead_s * 1e9))
    return risk


class HealthServicer(health_grpc.HealthMonitorServiceServicer):
    def __init__(self, settings: HealthSettings, fleet: Fleet | None = None):
        self.settings = settings
        self.fleet = fleet or Fleet(settings.health_config())
        self.alerts = AlertLog(settings.alerts_kept)
        self._fitting = False

    # --- ingestion --------------------------------------------------------------------

    @rpc_handler
    async def StreamTelemetry(self, request_iterator, context):
        accepted = 0
        async for request in request_iterator:
            try:
                check_sample(request.sample, self.settings.max_metrics)
            except StalwartError:
                SAMPLES.labels("rejected").inc()
                raise  # the stream ends with the error: the sender must fix itself
            self.ingest(request.sample, time.time())
            accepted += 1
        return health.StreamTelemetryResponse(samples_accepted=accepted)

    def ingest(self, sample, now: float) -> None:
        try:
            _, drafts = self.fleet.observe(sample.node_id, now, sample.step, dict(sample.metrics))
        except FleetFull:
            SAMPLES.labels("rejected").inc()
            raise
        finally:
            self._drop_series(self.fleet.forgotten)
        SAMPLES.labels("accepted").inc()
        assessed = self.fleet.assessments.get(sample.node_id)
        if assessed is not None:
            RISK.labels(sample.node_id).set(assessed.risk)
            ANOMALY.labels(sample.node_id).set(assessed.anomaly)
        for d in drafts:
            self._publish(KINDS[d.kind], d.node_id, d.risk, d.message, d.drain, now)
        if not self._fitting:
            samples = self.fleet.fit_samples(now)
            if samples is not None:
                self._fitting = True
                asyncio.ensure_future(self._fit(samples))

    @staticmethod
    def _drop_series(forgotten: list[str]) -> None:
        """Forgotten nodes' gauges leave /metrics with them (else the label set grows)."""
        while forgotten:
            node = forgotten.pop()
            for gauge in (RISK, ANOMALY):
                with contextlib.suppress(KeyError):
                    gauge.remove(node)

    async def _fit(self, samples) -> None:
        try:
            await asyncio.to_thread(self.fleet.forest.fit, samples)
            log.info(
                "anomaly detector fitted",
                features=self.fleet.forest.features,
                fits=self.fleet.forest.fits,
            )
        finally:
            self._fitting = False

    def _publish(self, kind, node_id, risk, message, drain, now) -> health.Alert:
        alert = health.Alert(alert_id=self.alerts.next_id(), kind=kind, node_id=node_id,
                             risk=risk, time=_ts(now), message=message, drain=drain)  # fmt: skip
        ALERTS.labels(KIND_NAMES[kind]).inc()
        if drain:
            DRAIN_REQUESTS.inc()
        log.warning("alert", kind=KIND_NAMES[kind], node=node_id, risk=round(risk, 3),
                    drain=drain, message=message)  # fmt: skip
        self.alerts.add(alert)
        return alert

    @rpc_handler
    async def RaiseAlert(self, request, context):
        if not request.node_id:
            raise StalwartError(ErrorKind.INVALID_ARGUMENT, "node_id is required")
        limits.check_string("node_id", request.node_id, limits.MAX_ID)
        limits.check_string("message", request.message, limits.MAX_REASON)
        if request.kind not in health.AlertKind.values():
            raise StalwartError(ErrorKind.INVALID_ARGUMENT, f"unknown alert kind {request.kind}")
        now = time.time()
        kind = request.kind or health.ALERT_KIND_DATA_CORRUPTION
        if kind == health.ALERT_KIND_DATA_CORRUPTION:
            self.fleet.report_corruption(request.node_id, request.message, now)
        alert = self._publish(kind, request.node_id, 1.0, request.message, request.drain, now)
        return health.RaiseAlertResponse(alert=alert)

    # --- queries ------------------------------------------------------------------------

    @rpc_handler
    async def GetNodeRisk(self, request, context):
        a = self.fleet.assessments.get(request.node_id)
        if a is None:
            raise StalwartError(ErrorKind.NOT_FOUND, f"no telemetry from {request.node_id!r}")
        return health.GetNodeRiskResponse(risk=risk_proto(a))

    @rpc_handler
    async def ListNodeRisks(self, request, context):
        items = sorted(self.fleet.assessments.values(), key=lambda a: (-a.risk, a.node_id))
        # the cursor is the last (risk, node) sent: opaque, and no entry shifts the pages
        chunk, token = paging.page(items, lambda a: [-a.risk, a.node_id],
                                   request.page_size, request.page_token)  # fmt: skip
        return health.ListNodeRisksResponse(risks=[risk_proto(a) for a in chunk],
                                            next_page_token=token)  # fmt: skip

    @rpc_handler
    async def ListAlerts(self, request, context):
        items = self.alerts.newest_first(request.node_id)
        chunk, token = paging.page(items, _alert_key, request.page_size, request.page_token)
        return health.ListAlertsResponse(alerts=chunk, next_page_token=token)

    @rpc_handler
    async def WatchAlerts(self, request, context):
        queue = self.alerts.subscribe()
        try:
            while (alert := await queue.get()) is not None:
                if alert.risk >= request.min_risk:
                    yield health.WatchAlertsResponse(alert=alert)
            raise StalwartError(ErrorKind.UNAVAILABLE, "watcher fell behind: list and watch again")
        finally:
            self.alerts.unsubscribe(queue)


def _alert_key(alert: health.Alert) -> list:
    """Newest first; the id breaks ties between alerts of the same instant."""
    return [-alert.time.ToNanoseconds(), alert.alert_id]
