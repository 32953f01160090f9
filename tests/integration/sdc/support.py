"""A small cluster for the health and corruption tests: coordinator, health service,
a paramserver pair, two trainers and a warm standby."""

from __future__ import annotations

import asyncio
import time

from stalwart.api import common, coordinator
from stalwart.client import CoordinatorClient
from tests.helpers import assert_eventually_async
from tests.integration.coordinator.support import wait_leader


async def start_cluster(procs, faults: dict[str, str], health: bool = False, backups: int = 1):
    """Returns (coordinator process, health process or None, paramserver primary, backup).

    ``faults`` maps process names (tr0, tr1, sb, ps-p, ps-b, ps-b2, ...) to their
    test-only faults. Backups after the first are named ps-b2, ps-b3, ...
    """
    health_proc = procs.start("services.health", "health") if health else None
    extra = ("--health", health_proc.address) if health_proc else ()
    coord = procs.coordinator("c1", *extra)
    await wait_leader(coord.address)
    join = ("--coordinator", coord.address)

    def paramserver(name: str, *flags: str):
        env = {"STALWART_FAULTS": faults[name]} if name in faults else None
        return procs.start("services.paramserver", name, *flags, *join, env=env)

    names = ["ps-b", *(f"ps-b{i}" for i in range(2, backups + 1))]
    backup, *more = await asyncio.gather(
        *(asyncio.to_thread(paramserver, n, "--role", "backup") for n in names)
    )
    replicas = ",".join(b.address for b in (backup, *more))

    def trainer(name: str, standby: bool):
        flags = [*join, *(("--standby",) if standby else ()), *extra]
        return procs.trainer(name, *flags, faults=faults.get(name, ""))

    # Start-up (imports) takes seconds per process on two shared cores: in parallel.
    primary, *_ = await asyncio.gather(
        asyncio.to_thread(paramserver, "ps-p", "--role", "primary", "--backups", replicas),
        *(asyncio.to_thread(trainer, n, sb) for n, sb in (("tr0", False), ("tr1", False),
                                                          ("sb", True))),
    )  # fmt: skip
    async with CoordinatorClient(coord.address) as client:

        async def trainers_registered():
            nodes = await client.all_nodes(common.NODE_ROLE_TRAINER)
            assert {n.node_id for n in nodes} == {"tr0", "tr1", "sb"}

        await assert_eventually_async(trainers_registered, timeout=60)
    return coord, health_proc, primary, backup


async def wait_job_done(client: CoordinatorClient, job_id: str, timeout: float) -> coordinator.Job:
    deadline = time.monotonic() + timeout
    job = None
    while time.monotonic() < deadline:
        job = await client.get_job(job_id)
        if job.state in (coordinator.JOB_STATE_SUCCEEDED, coordinator.JOB_STATE_FAILED):
            return job
        await asyncio.sleep(0.2)
    raise AssertionError(f"job {job_id} not finished after {timeout}s: {job}")


async def job_events(client: CoordinatorClient, job_id: str = "") -> list[common.Event]:
    """Every event so far (replayed), stopping after a quiet half second."""
    out: list[common.Event] = []
    stream = client.watch_events(job_id=job_id).__aiter__()
    while True:
        try:
            out.append(await asyncio.wait_for(stream.__anext__(), 0.5))
        except (TimeoutError, StopAsyncIteration):
            return out
