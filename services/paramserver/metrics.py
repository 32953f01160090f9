"""The paramserver's Prometheus series (deploy/grafana/metrics.txt), defined once.

State that is always at hand (version, epoch, role, how far backups lag) is read
when Prometheus scrapes, through gauge callbacks installed by :func:`watch`;
events (pushes, replication round trips, checkpoints) are counted where they
happen. Labels take closed sets of values only, pre-filled so that every series
exists from the first scrape and rates start at zero instead of appearing late.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge, Histogram

# Imported for their series: checkpoint chunk counters (stalwart.checkpoint) and
# corruption detections (stalwart.sdc) show on every replica from the first
# scrape, backups included, not only once a checkpoint or a detection happened.
from stalwart import checkpoint as _checkpoint_series  # noqa: F401
from stalwart import sdc
from stalwart.errors import ErrorKind, StalwartError

# Refused pushes that are corruption caught in flight: counted as detections too.
_CORRUPTION = {ErrorKind.CHECKSUM_MISMATCH: "crc", ErrorKind.NON_FINITE: "nonfinite"}

if TYPE_CHECKING:
    from services.paramserver.servicer import ParamServer

# Replication is a LAN round trip plus a backup's optimizer step: milliseconds,
# seconds when a backup is slow or being caught up.
_FAST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
# Checkpoint uploads take from milliseconds (a small delta) to minutes (a big model).
_SAVE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

VERSION = Gauge(
    "stalwart_paramserver_version",
    "Highest applied parameter version over the jobs this replica holds.",
)
EPOCH = Gauge("stalwart_paramserver_epoch", "Replica epoch (raised by every promotion).")
IS_PRIMARY = Gauge(
    "stalwart_paramserver_is_primary", "1 on the shard group's primary, 0 on backups."
)
PUSHES = Counter(
    "stalwart_paramserver_pushes_total",
    "Pushes answered: applied (acknowledged with a version), duplicate (applied "
    "before, acknowledged again), rejected (answered with an error, nothing applied "
    "by this call).",
    ["result"],
)
REPLICATION_LAG = Gauge(
    "stalwart_paramserver_replication_lag_versions",
    "On a primary: versions the furthest-behind configured backup lags, over every "
    "job; in-sync backups are at 0, a backup out of sync shows how far it fell behind "
    "until it is caught up. 0 on backups.",
)
REPLICATION_SECONDS = Histogram(
    "stalwart_paramserver_replication_seconds",
    "Time to apply one commit on every in-sync backup.",
    buckets=_FAST_BUCKETS,
)
CHECKPOINT_BYTES = Gauge(
    "stalwart_checkpoint_bytes", "Size of this replica's part of the last complete checkpoint."
)
CHECKPOINT_WRITTEN = Counter(
    "stalwart_checkpoint_written_bytes_total",
    "Checkpoint chunk bytes uploaded (deltas write only changed chunks).",
)
CHECKPOINT_SAVE_SECONDS = Histogram(
    "stalwart_checkpoint_save_seconds",
    "From the snapshot to the last chunk stored (this replica's part of a checkpoint).",
    buckets=_SAVE_BUCKETS,
)
CHECKPOINT_STALL_SECONDS = Histogram(
    "stalwart_checkpoint_stall_seconds",
    "Time training waited for a checkpoint snapshot (the job's lock held for the copy).",
    buckets=_FAST_BUCKETS,
)
CHECKPOINTS = Counter(
    "stalwart_checkpoints_total",
    "Checkpoint saves finished on this replica, complete or failed.",
    ["result"],
)

for _result in ("applied", "duplicate", "rejected"):
    PUSHES.labels(_result)
for _result in ("complete", "failed"):
    CHECKPOINTS.labels(_result)


def watch(servicer: ParamServer) -> None:
    """Read version, epoch, role and lag from ``servicer`` at every scrape.

    Called once by the process's main. The callbacks run on the HTTP server's
    thread while the event loop changes the dicts they read: each one copies a
    dict (one C call under the GIL) before iterating, so it never sees one
    change size under it.
    """
    from services.paramserver.replica import Role

    def version() -> float:
        return max((j.model.version for j in list(servicer.jobs.values())), default=0)

    VERSION.set_function(version)
    EPOCH.set_function(lambda: servicer.replica.epoch)
    IS_PRIMARY.set_function(lambda: 1 if servicer.replica.role is Role.PRIMARY else 0)
    REPLICATION_LAG.set_function(lambda: replication_lag(servicer))
    from prometheus_client import REGISTRY

    from services.paramserver.jobmetrics import JobSeries

    REGISTRY.register(JobSeries(servicer))  # per-job loss and evaluation series


def replication_lag(servicer: ParamServer) -> int:
    """Versions the furthest-behind backup of this primary lags (0 on a backup)."""
    from services.paramserver.replica import Role

    if servicer.replica.role is not Role.PRIMARY:
        return 0
    acked = dict(servicer.replicator.acked)
    lag = 0
    for job in list(servicer.jobs.values()):
        version = job.model.version
        for address in list(servicer.replica.backups):
            lag = max(lag, version - acked.get((address, job.model.job_id), 0))
    return lag


def counted_push(handler: Callable) -> Callable:
    """Count a push's answers by result (on the method that admits it, called under
    ``@rpc_handler``; it returns a tuple whose last item is the ``PushResponse``)."""

    @functools.wraps(handler)
    async def wrapper(self, request_iterator, context, *rest):
        try:
            result = await handler(self, request_iterator, context, *rest)
        except Exception as exc:
            PUSHES.labels("rejected").inc()
            if isinstance(exc, StalwartError) and exc.kind in _CORRUPTION:
                sdc.DETECTIONS.labels(_CORRUPTION[exc.kind]).inc()
            raise
        PUSHES.labels("duplicate" if result[-1].duplicate else "applied").inc()
        return result

    return wrapper


class Timer:
    """``with Timer(histogram):`` observes the block's wall time when it succeeds."""

    def __init__(self, histogram: Histogram) -> None:
        self.histogram = histogram

    def __enter__(self) -> Timer:
        self.started = time.perf_counter()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.histogram.observe(time.perf_counter() - self.started)


def counted_save(handler: Callable) -> Callable:
    """Record a SaveCheckpoint handler's outcome from its answer (under ``@rpc_handler``).

    The answer already carries what the dashboard shows (bytes, written bytes,
    how long training was held, how long the upload took), so nothing inside the
    save path has to know about metrics.
    """

    @functools.wraps(handler)
    async def wrapper(self, request, context):
        try:
            response = await handler(self, request, context)
        except Exception:
            CHECKPOINTS.labels("failed").inc()
            raise
        CHECKPOINTS.labels("complete").inc()
        CHECKPOINT_BYTES.set(response.total_bytes)
        CHECKPOINT_WRITTEN.inc(response.written_bytes)
        CHECKPOINT_STALL_SECONDS.observe(response.snapshot_seconds)
        CHECKPOINT_SAVE_SECONDS.observe(response.snapshot_seconds + response.upload_seconds)
        return response

    return wrapper
