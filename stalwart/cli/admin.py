"""``stalwart status | nodes | drain | failover``: the cluster as the coordinator sees it."""

from __future__ import annotations

import asyncio
import time

import typer
from rich.console import Console

from stalwart.api import common, coordinator
from stalwart.cli.output import (
    OUTPUT_OPTION,
    ExitCode,
    Output,
    cli_errors,
    emit,
    emit_mapping,
    emit_record,
    emit_rows,
    emit_table,
    fail,
    to_data,
)
from stalwart.cli.target import FROM_FLAGS, Target, option_groups
from stalwart.client.coordinator import CoordinatorClient
from stalwart.errors import RpcError


def enum_name(enum_type, value: int, prefix: str) -> str:
    """``NODE_STATE_ALIVE`` -> ``alive``; unknown numbers stay numbers."""
    try:
        return enum_type.Name(value).removeprefix(prefix).lower()
    except ValueError:
        return str(value)


def _slots_text(n: coordinator.Node) -> str:
    if len(n.slots) > 1:  # elastic: one trainer computes several slots
        return "slots " + ",".join(str(k) for k in n.slots)
    return f"slot {n.slot}"


def node_row(n: coordinator.Node) -> tuple:
    role = enum_name(common.NodeRole, n.role, "NODE_ROLE_")
    if n.role == common.NODE_ROLE_PARAMSERVER:
        replica = enum_name(common.ReplicaRole, n.replica_role, "REPLICA_ROLE_")
        if n.state == coordinator.NODE_STATE_DEAD:  # its role is the last one polled
            replica = f"(was {replica})" if replica else ""
        work = f"shard {n.shard} {replica}".rstrip()
    elif n.job_id:
        work = f"{n.job_id} " + (_slots_text(n) if n.slot >= 0 else "standby")
    else:
        work = "standby (idle)" if n.standby else "idle"
    ema = f"{n.step_time_ema_seconds * 1000:.0f} ms" if n.step_time_ema_seconds else ""
    state = enum_name(coordinator.NodeState, n.state, "NODE_STATE_")
    return (n.node_id, role, state, n.address, work, f"{n.health_score:.2f}", ema)


NODE_COLUMNS = ["node", "role", "state", "address", "work", "health", "step time"]


def job_row(j: coordinator.Job) -> tuple:
    state = enum_name(coordinator.JobState, j.state, "JOB_STATE_")
    held = sum(1 for s in j.slots if s.node_id)
    return (j.job_id, j.spec.model, state, f"{j.step}/{j.spec.steps}",
            f"{held}/{j.spec.num_slots}", j.reason)  # fmt: skip


JOB_COLUMNS = ["job", "model", "state", "step", "slots held", "reason"]


async def _status(client: CoordinatorClient) -> dict:
    leader = await client.cluster_status()
    replicas = []
    for address in client.addresses:
        try:
            st = await client.replica_status(address)
            replicas.append({"address": address, "reachable": True, "is_leader": st.is_leader})
        except RpcError as err:
            replicas.append({"address": address, "reachable": False, "error": err.message})
    nodes, jobs = await asyncio.gather(client.all_nodes(), client.all_jobs())
    return {"leader": leader, "replicas": replicas, "nodes": nodes, "jobs": jobs}


def status(output: Output = OUTPUT_OPTION, cluster: Target = FROM_FLAGS) -> None:
    """Leader, epoch, coordinator replicas, nodes and jobs."""
    data = cluster.call(_status)
    emit(output, _status_data(data), lambda: _status_tables(data))


def _status_data(data: dict) -> dict:
    leader = data["leader"]
    return {
        "leader_id": leader.leader_id,
        "leader_address": leader.leader_address,
        "epoch": leader.epoch,
        "store_url": leader.store_url,
        "nodes_alive": leader.nodes_alive,
        "jobs_running": leader.jobs_running,
        "replicas": data["replicas"],
        "nodes": [to_data(n) for n in data["nodes"]],
        "jobs": [to_data(j) for j in data["jobs"]],
    }


def _status_tables(data: dict) -> None:
    leader = data["leader"]
    emit_mapping(
        "cluster",
        {
            "leader": f"{leader.leader_id} at {leader.leader_address}",
            "epoch": leader.epoch,
            "store": leader.store_url,
            "nodes alive": leader.nodes_alive,
            "jobs running": leader.jobs_running,
        },
    )
    emit_table(
        "coordinator replicas",
        ["address", "role"],
        [
            (r["address"], ("leader" if r["is_leader"] else "standby") if r["reachable"]
             else f"unreachable: {r['error']}")
            for r in data["replicas"]
        ],
    )  # fmt: skip
    emit_table("nodes", NODE_COLUMNS, [node_row(n) for n in data["nodes"]])
    emit_table("jobs", JOB_COLUMNS, [job_row(j) for j in data["jobs"]])


def nodes(output: Output = OUTPUT_OPTION, cluster: Target = FROM_FLAGS) -> None:
    """Every registered node: role, state, what it holds, health, step time."""
    emit_rows(output, "nodes", NODE_COLUMNS, cluster.call(lambda c: c.all_nodes()), node_row)


def drain(
    node: str = typer.Argument(..., help="node id, as `stalwart nodes` shows it"),
    reason: str = typer.Option("drained from the CLI", help="recorded with the drain"),
    output: Output = OUTPUT_OPTION,
    cluster: Target = FROM_FLAGS,
) -> None:
    """Move a node's slot to a standby (or a free trainer), then give it no more work."""
    found, unheld = cluster.call(lambda c: _drain(c, node, reason))
    emit(output, found, lambda: emit_table("drained", NODE_COLUMNS, [node_row(found)]))
    if output is Output.table:
        for job_id, slots in unheld.items():  # the last trainer drained: said, not hidden
            Console(stderr=True).print(
                f"note: job {job_id} has no trainer for slot(s) {', '.join(map(str, slots))} "
                f"now; it waits until one registers, or `stalwart undrain {node}`"
            )


async def _drain(client: CoordinatorClient, node: str, reason: str):
    """Drain ``node``; the node, and each running job's slots that no trainer holds now."""
    found = await client.drain_node(node, reason)
    running = await client.all_jobs(coordinator.JOB_STATE_RUNNING)
    unheld = {j.job_id: [s.slot for s in j.slots if not s.node_id] for j in running}
    return found, {job_id: slots for job_id, slots in unheld.items() if slots}


def undrain(
    node: str = typer.Argument(..., help="node id, as `stalwart nodes` shows it"),
    release_quarantine: bool = typer.Option(
        False,
        "--release-quarantine",
        help="also a quarantined node (corrupt numbers came from it): once its hardware "
        "was checked or replaced",
    ),  # fmt: skip
    output: Output = OUTPUT_OPTION,
    cluster: Target = FROM_FLAGS,
) -> None:
    """Return a draining or drained node to service: it is given work again."""
    found = cluster.call(lambda c: c.undrain_node(node, release_quarantine=release_quarantine))
    emit(output, found, lambda: emit_table("undrained", NODE_COLUMNS, [node_row(found)]))


def failover(output: Output = OUTPUT_OPTION, cluster: Target = FROM_FLAGS) -> None:
    """Ask the leader coordinator to step down; a standby replica takes over."""
    emit_record(output, "failover", cluster.call(lambda c: _failover(c, cluster.timeout)))


async def _failover(client: CoordinatorClient, timeout: float) -> dict:
    before = await client.cluster_status()
    old_epoch = await client.step_down()
    after = await _next_leader(client, old_epoch, time.monotonic() + timeout)
    if after is None:
        fail(
            f"the leader stepped down (epoch {old_epoch}) and no new leader answered "
            f"within {timeout:g} s; `stalwart status` shows when one takes over",
            ExitCode.UNREACHABLE,
        )
    return {
        "old_leader": before.leader_id,
        "old_epoch": old_epoch,
        "new_leader": after.leader_id,
        "new_epoch": after.epoch,
    }


async def _next_leader(client: CoordinatorClient, old_epoch: int, deadline: float):
    """The cluster's status once a leader of a later epoch answers, or None at ``deadline``
    (a new leader takes ~0.1-1 s; each status call is cut short at the deadline too)."""
    while (left := deadline - time.monotonic()) > 0:
        await asyncio.sleep(min(0.1, left))
        try:
            after = await asyncio.wait_for(client.cluster_status(), max(left, 0.1))
        except (TimeoutError, RpcError):
            continue
        if after.epoch > old_epoch and after.leader_address:
            return after
    return None


def register(app: typer.Typer) -> None:
    """Add the commands to the top-level app (they read best without a group name)."""
    for fn in (status, nodes, drain, undrain, failover):
        app.command(fn.__name__)(cli_errors(option_groups(fn)))
