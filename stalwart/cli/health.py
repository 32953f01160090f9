"""``stalwart health``: every node's failure risk as the health service sees it.

Per node: the risk in [0, 1], the unlabelled anomaly score, the signals that
contribute most (highest first) and the predicted lead time (how long until the
failure a rule expects; "-" when none is predicted). Highest risk first.

Which health service: ``--health`` (or ``STALWART_HEALTH``), else the one the
cluster's coordinators list (it registers with role HEALTH), found through
``--coordinator`` / ``--run-dir`` / ``runs/latest`` like every other command.
"""

from __future__ import annotations

import asyncio

import grpc
import typer

from stalwart.api import common, health, health_grpc
from stalwart.channel import open_channel
from stalwart.cli.output import OUTPUT_OPTION, ExitCode, Output, emit_rows, fail
from stalwart.cli.target import FROM_FLAGS, Target, option_groups

CALL_TIMEOUT_S = 5.0
COLUMNS = ["node", "risk", "anomaly", "top signals", "lead time", "updated"]

HEALTH_OPTION = typer.Option(
    "",
    "--health",
    envvar="STALWART_HEALTH",
    help="health service host:port; default: the one the cluster's coordinators list",
)


def lead_seconds(risk: health.NodeRisk) -> float | None:
    """The predicted lead time in seconds; None when no failure is predicted."""
    if not risk.HasField("predicted_lead_time"):
        return None
    return risk.predicted_lead_time.ToNanoseconds() / 1e9


def risk_row(r: health.NodeRisk) -> tuple:
    lead = lead_seconds(r)
    shown = "-" if lead is None else ("now" if lead == 0 else f"{lead:.0f} s")
    updated = r.update_time.ToDatetime().strftime("%H:%M:%S") if r.update_time.seconds else "-"
    return (r.node_id, f"{r.risk:.2f}", f"{r.anomaly_score:.2f}",
            ", ".join(r.top_signals) or "-", shown, updated)  # fmt: skip


def risk_data(r: health.NodeRisk) -> dict:
    return {
        "node_id": r.node_id,
        "risk": r.risk,
        "anomaly_score": r.anomaly_score,
        "top_signals": list(r.top_signals),
        "predicted_lead_time_seconds": lead_seconds(r),
        "update_time": r.update_time.ToJsonString() if r.update_time.seconds else None,
    }


async def list_risks(address: str) -> list[health.NodeRisk]:
    """Every node's risk, highest first, page after page."""
    out: list[health.NodeRisk] = []
    async with open_channel(address) as channel:
        stub = health_grpc.HealthMonitorServiceStub(channel)
        token = ""
        while True:
            page = await stub.ListNodeRisks(
                health.ListNodeRisksRequest(page_token=token), timeout=CALL_TIMEOUT_S
            )
            out.extend(page.risks)
            token = page.next_page_token
            if not token:
                return out


def find_health(cluster: Target) -> str:
    """The address of the health service the cluster's coordinators list."""
    nodes = cluster.call(lambda c: c.all_nodes(common.NODE_ROLE_HEALTH))
    if not nodes:
        fail("the cluster lists no health service (started with --no-health?); "
             "pass --health host:port", ExitCode.UNREACHABLE)  # fmt: skip
    return nodes[0].address


@option_groups
def show(
    ctx: typer.Context,
    health_address: str = HEALTH_OPTION,
    output: Output = OUTPUT_OPTION,
    cluster: Target = FROM_FLAGS,
) -> None:
    """Per-node risk, anomaly score, top contributing signals and predicted lead time."""
    if ctx.invoked_subcommand is not None:
        return  # `stalwart health eval ...`: the flags above are not its own
    address = health_address.strip() or find_health(cluster)
    try:
        risks = asyncio.run(list_risks(address))
    except grpc.RpcError as exc:
        fail(f"cannot read risks from the health service at {address}: {exc.details()}",
             ExitCode.UNREACHABLE)  # fmt: skip
    emit_rows(output, f"node risk ({address})", COLUMNS, risks, risk_row, risk_data)
