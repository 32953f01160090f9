"""Run a fault schedule (schedule.py) against a local cluster while one sync job trains.

Before each fault the cluster must be whole (a leader, every live member registered
and alive); the fault's target is resolved from what the cluster reports at that
moment; a killed process gets a stand-in (as an operator or Kubernetes would start
one), a restarted one comes back under its id and port with its start-up flags, and
a stopped one is resumed after its pause. The outcome carries the job, its
events and final weights, for the invariants the test checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from stalwart import cluster
from stalwart.api import coordinator, paramserver, paramserver_grpc
from stalwart.channel import open_channel
from stalwart.client.coordinator import FINISHED, CoordinatorClient
from stalwart.demo.run import pick_target
from stalwart.demo.watch import EventRecorder, param_client, pull_weights
from tests.chaos.netns import TestNet
from tests.chaos.schedule import Fault
from tests.integration.cluster import support

HEALTHY_WITHIN_S = 120.0
STALL_S = 90.0  # no step for this long: the job is stuck, not slow


@dataclass
class Applied:
    fault: Fault
    target: str
    step: int


@dataclass
class Outcome(support.Outcome):
    """The cluster tests' outcome of a job, with the faults that were applied."""

    applied: list[Applied] = field(default_factory=list)


async def run(
    local: cluster.LocalCluster, spec, faults: list[Fault], net: TestNet | None = None
) -> Outcome:
    """``net``: the hosts of a cluster started on network namespaces, for the network
    faults (``cut``, ``partition``)."""
    async with CoordinatorClient(local.coordinator_addresses, retry_for_s=30.0) as client:
        job = await client.create_job(spec)
        recorder = EventRecorder(client, job.job_id)
        watch = asyncio.create_task(recorder.run())
        applied: list[Applied] = []
        try:
            for fault in faults:
                # a repair can outlast the steps between two faults: never hit the
                # same step twice, and keep the schedule's order
                await _wait_step(recorder, max(fault.at_step, recorder.step + 2))
                if recorder.finished:
                    break
                await cluster.wait_healthy(local, HEALTHY_WITHIN_S)  # health before
                await _apply(local, net, client, job.job_id, recorder, fault, applied)
            await cluster.wait_healthy(local, HEALTHY_WITHIN_S)  # and after
            job = await _wait_finished(client, job.job_id)
            version, weights = -1, {}
            if job.state == coordinator.JOB_STATE_SUCCEEDED:  # else the state is the verdict
                ps = await param_client(client, job.job_id, spec)
                try:
                    version, weights = await pull_weights(ps, job.job_id, spec.steps)
                finally:
                    await ps.close()
        finally:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watch
    return Outcome(job, list(recorder.events), weights, version, applied=applied)


async def _apply(
    local, net, client, job_id, recorder, fault: Fault, applied: list[Applied]
) -> None:
    """The fault (and its pair, ``delay_s`` later) at once; returns when all are repaired."""
    first = asyncio.create_task(_hit(local, net, client, job_id, recorder, fault, applied))
    tasks = [first]
    if fault.then is not None:
        await asyncio.sleep(fault.delay_s)  # the schedule's gap between the two faults
        tasks.append(
            asyncio.create_task(_hit(local, net, client, job_id, recorder, fault.then, applied))
        )
    await asyncio.gather(*tasks)


async def _hit(local, net, client, job_id, recorder, fault: Fault, applied: list[Applied]) -> None:
    try:
        name = await target(fault.role, local, client, job_id)
    except TimeoutError:
        if recorder.finished:
            return  # the job ended while its trainers were sought: this fault never lands
        raise
    applied.append(Applied(fault, name, recorder.step))
    if fault.action in ("cut", "partition"):
        await _network_fault(local, net, name, fault)
        return
    if fault.action == "restart":
        await asyncio.to_thread(local.kill, name)
        await _wait_dead(local, name)
        await asyncio.to_thread(local.restart, name)
        return
    if fault.action == "stop":
        local.pause(name)
        try:
            await asyncio.sleep(fault.stop_s)  # the pause is the fault itself
        finally:
            local.resume(name)
        return
    stand_in = await _kill_and_replace(local, name)
    if fault.kill_stand_in:
        await cluster.wait_healthy(local, HEALTHY_WITHIN_S)
        applied.append(Applied(Fault(recorder.step, "kill", "stand-in"), stand_in, recorder.step))
        await _kill_and_replace(local, stand_in)


async def _network_fault(local, net: TestNet | None, name: str, fault: Fault) -> None:
    """Cut the host's link, or partition it from every coordinator, for ``stop_s``."""
    assert net is not None, f"{fault.action} needs a cluster on network namespaces"
    if fault.action == "cut":
        net.cut(name)
        undo = net.restore
    else:
        coordinators = [m.name for m in local.of_role("coordinator") if m.name != name]
        net.partition(name, away_from=coordinators)
        undo = net.heal
    try:
        await asyncio.sleep(fault.stop_s)  # the outage is the fault itself
    finally:
        undo(name)


async def _kill_and_replace(local: cluster.LocalCluster, name: str) -> str:
    await asyncio.to_thread(local.kill, name)
    await _wait_dead(local, name)
    return (await asyncio.to_thread(local.replace, name)).name


async def _wait_dead(local: cluster.LocalCluster, name: str) -> None:
    deadline = time.monotonic() + 30
    while local.alive(name):
        assert time.monotonic() < deadline, f"{name} outlived kill -9"
        await asyncio.sleep(0.05)


async def target(role: str, local: cluster.LocalCluster, client, job_id: str) -> str:
    """The member that plays ``role`` for the job right now."""
    if role in ("trainer", "leader"):
        return await pick_target("coordinator" if role == "leader" else "trainer",
                                 local, client, job_id)  # fmt: skip
    if role == "primary":
        return await pick_target("paramserver", local, client, job_id)
    if role in ("backup", "spare"):
        # the shard map lists every other replica for clients to fail over to: the
        # primary itself says which of them it replicates to
        group = (await client.get_shard_map(job_id)).groups[0]
        backups = await _backups_of(group.primary_address)
        if role == "backup":
            return local.by_address(backups[0]).name
        serving = {local.by_address(a).name for a in [group.primary_address, *backups]}
        replicas = [m for m in local.of_role("paramserver") if m.shard == group.shard]
        return _first_alive(local, "paramserver", exclude=serving, among=replicas)
    if role == "standby":
        job = await client.get_job(job_id)
        holders = {s.node_id for s in job.slots}
        return _first_alive(local, "trainer", exclude=holders)
    if role == "follower":
        leader = (await client.cluster_status()).leader_address
        return _first_alive(local, "coordinator", exclude={local.by_address(leader).name})
    raise ValueError(f"unknown role {role!r}")


async def _backups_of(primary: str) -> list[str]:
    async with open_channel(primary) as channel:
        stub = paramserver_grpc.ParamServerServiceStub(channel)
        reply = await stub.GetReplicaStatus(paramserver.GetReplicaStatusRequest(), timeout=10)
    assert reply.backups, f"the primary at {primary} replicates to no backup"
    return [b.address for b in reply.backups]


def _first_alive(
    local: cluster.LocalCluster, role: str, exclude: set[str], among: list | None = None
) -> str:
    for m in among if among is not None else local.of_role(role):
        if m.name not in exclude and local.alive(m.name):
            return m.name
    raise AssertionError(f"no live {role} outside {sorted(exclude)}")


async def _wait_step(recorder: EventRecorder, step: int) -> None:
    while recorder.step < step and not recorder.finished:
        before = recorder.step
        if not await recorder.wait_step(step, STALL_S) and recorder.step == before:
            raise AssertionError(f"job stuck at step {before} (no step for {STALL_S:.0f}s)")


async def _wait_finished(client: CoordinatorClient, job_id: str) -> coordinator.Job:
    last, moved = -1, time.monotonic()
    while True:
        job = await client.get_job(job_id)
        if job.state in FINISHED:
            return job
        if job.step != last:
            last, moved = job.step, time.monotonic()
        assert time.monotonic() - moved < STALL_S, f"job stuck at step {job.step}"
        await asyncio.sleep(0.3)
