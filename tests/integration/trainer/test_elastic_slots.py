"""Elastic slots with real processes: a 3-slot job with no standby loses two of its
three trainers (SIGKILL) and finishes on the one left, which computes all three
slots; a second job starts on that one trainer alone, two trainers join and take
slots from it at the very next step, and both jobs end bitwise equal to the
fault-free reference run."""

from __future__ import annotations

import asyncio

import pytest

from stalwart import training
from stalwart.api import common, coordinator
from stalwart.client import CoordinatorClient
from tests.helpers import assert_eventually_async

from .support import (
    assert_bitwise_equal,
    coordinated_paramservers,
    final_weights,
    small_spec,
    wait_exit,
    wait_trainers,
)
from .test_trainer_with_coordinator import _events_until_end, trainer_status, wait_job_done

pytestmark = pytest.mark.timeout(1200)  # two reference runs first; slow when loaded

HANG_AT = 12  # job B's step at which its lone trainer stops (still heartbeating)


def slot_of(event: common.Event) -> int:
    return int(event.attributes["slot"])


def holders(job: coordinator.Job) -> dict[int, str]:
    return {s.slot: s.node_id for s in job.slots}


async def test_fewer_trainers_than_slots_then_more_bitwise(cluster_procs):
    procs = cluster_procs
    spec_a = small_spec(num_slots=3, steps=10)
    spec_b = small_spec(num_slots=3, steps=16)
    training.make_deterministic()
    want_a = await asyncio.to_thread(training.reference_run, spec_a)
    want_b = await asyncio.to_thread(training.reference_run, spec_b)

    join, paramservers = await coordinated_paramservers(procs)
    pulls = [p.address for p in paramservers]
    # tr0 and tr2 SIGKILL themselves at step 3 of job A (before pushing it); tr1
    # stops making progress at step HANG_AT, which only job B reaches.
    doomed = [procs.trainer(n, *join, faults="crash_at_step=3") for n in ("tr0", "tr2")]
    lone = procs.trainer("tr1", *join, faults=f"hang_at_step={HANG_AT}")

    async with CoordinatorClient(join[1]) as client:
        await wait_trainers(client, {"tr0", "tr1", "tr2"}, 60)

        # --- job A: two of three trainers die; the job finishes on the third -------
        job_a = await client.create_job(spec_a, job_id="elastic-a")
        assert holders(job_a) == {0: "tr0", 1: "tr1", 2: "tr2"}
        done = await wait_job_done(client, job_a.job_id, 240)
        assert done.state == coordinator.JOB_STATE_SUCCEEDED, done.reason
        events_a = [e async for e in _events_until_end(client, job_a.job_id)]
        for proc in doomed:
            assert await asyncio.to_thread(wait_exit, proc, 5) == -9
            assert "fault fired" in proc.log_tail(200)
        taken = {slot_of(e): e.step for e in events_a
                 if e.kind == common.EVENT_KIND_SLOT_ASSIGNED and e.node_id == "tr1"}  # fmt: skip
        # its own slot from the start, the dead ones' slots once they died at step 3
        # (the event's step is the coordinator's view of the job, which may lag)
        assert sorted(taken) == [0, 1, 2] and taken[1] == 0, taken
        assert taken[0] == taken[2] and 0 < taken[0] <= 3, taken
        version, got = await final_weights(pulls, job_a.job_id, spec_a)
        assert version == spec_a.steps
        assert_bitwise_equal(got, want_a)

        # --- job B: one live trainer runs all three slots at once -----------------
        job_b = await client.create_job(spec_b, job_id="elastic-b")
        assert holders(job_b) == {0: "tr1", 1: "tr1", 2: "tr1"}
        assert job_b.state == coordinator.JOB_STATE_RUNNING  # no wait for more trainers

        async def stalled_at_hang():
            job = await client.get_job(job_b.job_id)
            assert job.step == HANG_AT and holders(job) == {0: "tr1", 1: "tr1", 2: "tr1"}

        await assert_eventually_async(stalled_at_hang, timeout=240)
        newcomers = [procs.trainer(n, *join) for n in ("tr3", "tr4")]

        async def spread_out():
            job = await client.get_job(job_b.job_id)
            # whichever newcomer registered first took slot 2 (tr1's highest)
            assert holders(job)[0] == "tr1" and sorted(holders(job).values())[1:] == [
                "tr3", "tr4"
            ], holders(job)  # fmt: skip
            return job

        job = await assert_eventually_async(spread_out, timeout=120)
        assert job.step == HANG_AT  # the slots moved before step HANG_AT committed
        lone.kill()  # the hung trainer: its slot 0 goes to one of the newcomers
        done = await wait_job_done(client, job_b.job_id, 240)
        assert done.state == coordinator.JOB_STATE_SUCCEEDED, done.reason
        events_b = [e async for e in _events_until_end(client, job_b.job_id)]

    moves = [(e.node_id, slot_of(e), e.step) for e in events_b
             if e.kind == common.EVENT_KIND_SLOT_ASSIGNED]  # fmt: skip
    assert moves[:3] == [("tr1", 0, 0), ("tr1", 1, 0), ("tr1", 2, 0)], moves
    # the newcomers took slots 1 and 2 at the step the job stood at (the next to
    # commit), then one of them slot 0 once tr1 was dead
    later = moves[3:]
    assert {(n, st) for n, _, st in later} <= {("tr3", HANG_AT), ("tr4", HANG_AT)}, moves
    assert sorted(s for _, s, _ in later) == [0, 1, 2], moves
    assert {n for n, s, _ in later if s in (1, 2)} == {"tr3", "tr4"}, moves
    for proc in newcomers:  # both computed up to the last step
        assert (await trainer_status(proc.address)).step == spec_b.steps - 1
    version, got = await final_weights(pulls, job_b.job_id, spec_b)
    assert version == spec_b.steps
    assert_bitwise_equal(got, want_b)
