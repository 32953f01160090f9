"""``stalwart top``: a live view of the cluster, refreshed in place.

Leader and epoch, every node (role, state, health score, slot, step time, and the
health service's risk when ``--health`` names it), every job (step, throughput,
latest training loss and last evaluation, from the job's paramserver), and the latest events from WatchEvents. ``--once`` prints one frame and exits,
for scripts and tests (``-o json`` for the same data as JSON).

Throughput is measured here, from the job's step between two frames (steps/s,
and samples/s = steps/s x batch size x slots), so it needs no Prometheus; the
first frame has none yet.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
import typer
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from stalwart.api import common, coordinator, health, health_grpc, paramserver
from stalwart.channel import open_channel
from stalwart.cli.admin import enum_name, node_row
from stalwart.cli.output import OUTPUT_OPTION, Output, emit, table_console, to_data
from stalwart.cli.target import FROM_FLAGS, Target, option_groups
from stalwart.client.coordinator import CoordinatorClient
from stalwart.client.jobmetrics import JobMetricsReader
from stalwart.errors import RpcError, StalwartError

EVENTS_SHOWN = 10
# With --once the event history is read until the stream stays quiet this long
# (the store replays it at once; a quiet stream means we are at the live edge).
EVENT_QUIET_S = 0.5
# ... and at most this long in all: a fast job's step events never leave it quiet.
EVENT_READ_S = 2.0
HEALTH_TIMEOUT_S = 2.0
# Latest loss and evaluation are read for this many jobs at most (the newest),
# each from its paramserver, within this long; the others show "-".
METRICS_JOBS = 20
METRICS_TIMEOUT_S = 2.0


@dataclass
class Frame:
    """What one refresh shows."""

    status: coordinator.GetClusterStatusResponse
    nodes: list[coordinator.Node]
    jobs: list[coordinator.Job]
    risks: dict[str, health.NodeRisk] | None  # None: no health service asked or answering
    events: list[common.Event]
    rates: dict[str, float] = field(default_factory=dict)  # job -> steps per second
    # job -> its metric history's summary (latest loss, last evaluation), where read
    metrics: dict[str, paramserver.JobMetricsSummary] = field(default_factory=dict)
    taken_at: float = field(default_factory=time.time)


class Rates:
    """Steps per second of each job between two frames."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, int]] = {}

    def update(self, jobs: list[coordinator.Job], now: float) -> dict[str, float]:
        rates = {}
        for job in jobs:
            before = self._last.get(job.job_id)
            if before is not None and now > before[0] and job.step >= before[1]:
                rates[job.job_id] = (job.step - before[1]) / (now - before[0])
            self._last[job.job_id] = (now, job.step)
        return rates


async def read_risks(address: str) -> dict[str, health.NodeRisk] | None:
    """Every node's risk from the health service, or None when it does not answer."""
    if not address:
        return None
    risks: dict[str, health.NodeRisk] = {}
    async with open_channel(address) as channel:
        stub = health_grpc.HealthMonitorServiceStub(channel)
        token = ""
        try:
            while True:
                page = await stub.ListNodeRisks(
                    health.ListNodeRisksRequest(page_token=token), timeout=HEALTH_TIMEOUT_S
                )
                risks.update({r.node_id: r for r in page.risks})
                token = page.next_page_token
                if not token:
                    return risks
        except grpc.RpcError:
            return None  # the view goes on without risks: a column of "-"


async def take_frame(
    client: CoordinatorClient, health_address: str, events: list[common.Event]
) -> Frame:
    status, nodes, jobs, risks = await asyncio.gather(
        client.cluster_status(), client.all_nodes(), client.all_jobs(), read_risks(health_address)
    )
    frame = Frame(status, nodes, jobs, risks, events[-EVENTS_SHOWN:])
    frame.metrics = await read_summaries(client, jobs)
    return frame


async def read_summaries(
    client: CoordinatorClient, jobs: list[coordinator.Job]
) -> dict[str, paramserver.JobMetricsSummary]:
    """Each (newest) job's latest loss and evaluation; a job whose paramserver does
    not answer in time is left out (a "-")."""

    async def one(job_id: str):
        async with JobMetricsReader(client, job_id, call_timeout_s=METRICS_TIMEOUT_S) as reader:
            try:
                return job_id, await asyncio.wait_for(reader.read_summary(), METRICS_TIMEOUT_S)
            except (TimeoutError, grpc.RpcError, RpcError, StalwartError):
                return job_id, None

    newest = sorted(jobs, key=lambda j: j.create_time.ToNanoseconds(), reverse=True)
    found = await asyncio.gather(*(one(j.job_id) for j in newest[:METRICS_JOBS]))
    return {job_id: s for job_id, s in found if s is not None}


async def recent_events(
    client: CoordinatorClient, quiet_s: float = EVENT_QUIET_S, limit_s: float = EVENT_READ_S
) -> list:
    """The stored event history up to the live edge (for a single frame): read until
    the stream is quiet for ``quiet_s``, or for ``limit_s`` in all, since a running job
    commits a step (an event) more often than ``quiet_s``."""
    kept: collections.deque = collections.deque(maxlen=EVENTS_SHOWN)
    stream = aiter(client.watch_events())
    deadline = time.monotonic() + limit_s
    try:
        while (left := deadline - time.monotonic()) > 0:
            kept.append(await asyncio.wait_for(anext(stream), min(quiet_s, left)))
    except (TimeoutError, StopAsyncIteration):
        pass
    finally:
        await stream.aclose()
    return list(kept)


async def follow_events(client: CoordinatorClient, into: collections.deque) -> None:
    events: AsyncIterator[common.Event] = client.watch_events()
    async for event in events:
        into.append(event)


# --- rendering ---------------------------------------------------------------------


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds else "-"


def render(frame: Frame) -> Group:
    s = frame.status
    header = Text.assemble(
        ("stalwart top", "bold"),
        f"  leader {s.leader_id or '-'} at {s.leader_address or '-'}  epoch {s.epoch}  ",
        f"nodes alive {s.nodes_alive}  jobs running {s.jobs_running}  ",
        (time.strftime("%H:%M:%S", time.localtime(frame.taken_at)), "dim"),
    )
    nodes = Table(title="nodes", expand=False)
    for column in ("node", "role", "state", "health", "risk", "work", "step time"):
        nodes.add_column(column)
    for n in sorted(frame.nodes, key=lambda n: (n.role, n.node_id)):
        risk = frame.risks.get(n.node_id) if frame.risks is not None else None
        node_id, role, state, _address, work, score, _ema = node_row(n)  # as `stalwart nodes`
        shown_risk = f"{risk.risk:.2f}" if risk is not None else "-"
        nodes.add_row(node_id, role, state, score, shown_risk, work, _ms(n.step_time_ema_seconds))
    jobs = Table(title="jobs", expand=False)
    for column in ("job", "model", "state", "step", "slots held", "steps/s", "samples/s",
                   "loss", "last eval"):  # fmt: skip
        jobs.add_column(column)
    for j in frame.jobs:
        rate = frame.rates.get(j.job_id)
        samples = rate * j.spec.batch_size * max(j.spec.num_slots, 1) if rate is not None else None
        jobs.add_row(
            j.job_id,
            j.spec.model,
            enum_name(coordinator.JobState, j.state, "JOB_STATE_"),
            f"{j.step}/{j.spec.steps}",
            f"{sum(1 for x in j.slots if x.node_id)}/{j.spec.num_slots}",
            f"{rate:.1f}" if rate is not None else "-",
            f"{samples:.0f}" if samples is not None else "-",
            *metric_cells(frame.metrics.get(j.job_id)),
        )
    events = Table(title="recent events", expand=False)
    for column in ("#", "time", "kind", "event"):
        events.add_column(column)
    for e in frame.events:
        when = time.strftime("%H:%M:%S", time.localtime(e.time.seconds))
        kind = enum_name(common.EventKind, e.kind, "EVENT_KIND_")
        events.add_row(str(e.sequence), when, kind, e.message)
    return Group(header, nodes, jobs, events)


def metric_cells(summary: paramserver.JobMetricsSummary | None) -> tuple[str, str]:
    """(latest loss "2.31 @12", last evaluation "v10 accuracy=0.91 ...") or dashes."""
    if summary is None:
        return "-", "-"
    loss = f"{summary.latest_loss:.4f} @{summary.latest_step}" if summary.loss_slots else "-"
    if not summary.HasField("last_evaluation"):
        return loss, "-"
    e = summary.last_evaluation
    shown = " ".join(f"{k}={v:.4g}" for k, v in sorted(e.metrics.items())[:3])
    return loss, f"v{e.version} {shown}"


def frame_data(frame: Frame) -> dict:
    return {
        "status": to_data(frame.status),
        "nodes": [to_data(n) for n in frame.nodes],
        "jobs": [to_data(j) for j in frame.jobs],
        "risks": None if frame.risks is None else [to_data(r) for r in frame.risks.values()],
        "events": [to_data(e) for e in frame.events],
        "metrics": {job_id: to_data(s) for job_id, s in frame.metrics.items()},
    }


# --- the command -------------------------------------------------------------------


@option_groups
def top(
    once: bool = typer.Option(
        False, "--once", help="print one frame and exit (--output json always does)"
    ),
    interval: float = typer.Option(1.0, "--interval", min=0.1, help="seconds between frames"),
    health_address: str = typer.Option(
        "",
        "--health",
        envvar="STALWART_HEALTH",
        help="health service host:port, for each node's risk; default: none",
    ),  # fmt: skip
    output: Output = OUTPUT_OPTION,
    cluster: Target = FROM_FLAGS,
) -> None:
    """A live view of the cluster: nodes, jobs, throughput, risk, recent events."""
    addresses = cluster.addresses()

    async def one() -> Frame:
        async with cluster.client(addresses) as client:
            return await take_frame(client, health_address, await recent_events(client))

    if once or output is Output.json:  # JSON is one frame: a live table cannot be parsed
        frame = asyncio.run(one())
        return emit(output, frame_data(frame), lambda: _print_frame(frame))
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_live(cluster, addresses, health_address, interval))


def _print_frame(frame: Frame) -> None:
    table_console().print(render(frame))


async def _live(cluster: Target, addresses: list[str], health_address: str, interval: float):
    events: collections.deque = collections.deque(maxlen=EVENTS_SHOWN)
    rates = Rates()
    async with cluster.client(addresses) as client:
        follower = asyncio.create_task(follow_events(client, events))
        try:
            frame = await take_frame(client, health_address, list(events))
            rates.update(frame.jobs, frame.taken_at)  # the baseline of the first rates
            if not Console().is_terminal:
                # Piped or logged, as `top -b`: each frame printed whole, one after
                # another (a live display draws nothing there until it stops).
                while True:
                    _print_frame(frame)
                    sys.stdout.flush()
                    await asyncio.sleep(interval)
                    frame = await take_frame(client, health_address, list(events))
                    frame.rates = rates.update(frame.jobs, frame.taken_at)
            with Live(render(frame), auto_refresh=False, screen=False) as live:
                while True:
                    await asyncio.sleep(interval)
                    frame = await take_frame(client, health_address, list(events))
                    frame.rates = rates.update(frame.jobs, frame.taken_at)
                    live.update(render(frame), refresh=True)
        finally:
            follower.cancel()
            with contextlib.suppress(BaseException):
                await follower
