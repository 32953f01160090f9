"""A flush whose store write fails keeps what it held: the next flush writes it.

Before, the changes and events were dropped with the failed write: a job cancelled in
memory stayed RUNNING in the store (the client's retry found it cancelled and wrote
nothing), so the next leader brought it back to life."""

from __future__ import annotations

import asyncio

import pytest

from stalwart.api import common as EV
from stalwart.api import coordinator
from stalwart.errors import ErrorKind, StalwartError
from tests.unit.coordinator.leaders import elected


class _Refused(Exception):
    """What a store client raises when the store refuses a write (a dropped connection)."""


def test_a_failed_write_is_written_by_the_next_flush(tmp_path) -> None:
    url = f"shm://{tmp_path}/state"
    control = elected(url, 1)
    spec = coordinator.JobSpec(model="mlp", num_slots=1, steps=10, batch_size=1)
    asyncio.run(control.create_job("j", spec, ""))
    put_job, failures = control.state.put_job, []

    def refuse_once(epoch, job):
        if not failures:
            failures.append(job.job_id)
            raise _Refused("connection reset")
        put_job(epoch, job)

    control.state.put_job = refuse_once
    with pytest.raises(_Refused):
        asyncio.run(control.cancel_job("j", "by hand"))
    assert failures == ["j"]
    assert control.jobs["j"].finished  # in memory: the cancel took place
    stored = {j.job_id: j.state for j in control.state.jobs()}
    assert stored["j"] == coordinator.JOB_STATE_PENDING  # not written yet

    asyncio.run(control.tick())  # the next flush (here the leader's tick)
    stored = {j.job_id: j.state for j in control.state.jobs()}
    assert stored["j"] == coordinator.JOB_STATE_CANCELLED
    kinds = [(e.sequence, e.kind) for e in control.state.events()]
    assert [s for s, _ in kinds] == sorted({s for s, _ in kinds})  # each stored once, in order
    assert EV.EVENT_KIND_JOB_STATE_CHANGED in {k for _, k in kinds}
    assert elected(url, 2).jobs["j"].finished  # the next leader agrees


def test_a_write_the_timeout_gave_up_on_is_waited_for_before_the_next(tmp_path) -> None:
    control = elected(f"shm://{tmp_path}/state", 1)
    control.settings = control.settings.model_copy(update={"store_timeout_seconds": 0.2})
    spec = coordinator.JobSpec(model="mlp", num_slots=1, steps=10, batch_size=1)

    async def scenario() -> list[str]:
        release, order = asyncio.Event(), []
        loop = asyncio.get_running_loop()
        put_job = control.state.put_job

        def slow_then_fast(epoch, job):
            if not order:
                order.append("slow started")
                asyncio.run_coroutine_threadsafe(release.wait(), loop).result()
                order.append("slow landed")
            else:
                order.append("next")
            put_job(epoch, job)

        control.state.put_job = slow_then_fast
        with pytest.raises(StalwartError) as first:
            await control.create_job("a", spec, "")
        assert first.value.kind is ErrorKind.UNAVAILABLE
        with pytest.raises(StalwartError) as second:  # the first write still runs
            await control.create_job("b", spec, "")
        assert "still runs" in str(first.value) + str(second.value)
        release.set()
        await control.tick()
        return order

    order = asyncio.run(scenario())
    assert order[:2] == ["slow started", "slow landed"]
    assert set(order[2:]) == {"next"}
    assert {j.job_id for j in control.state.jobs()} == {"a", "b"}
