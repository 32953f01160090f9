"""Trainers driven by assignment files (no coordinator) against a real paramserver pair:
the final weights equal reference_run bitwise, also when a trainer dies mid-job."""

from __future__ import annotations

import asyncio

import pytest

from stalwart import training

from .support import assert_bitwise_equal, final_weights, small_spec, wait_exit, write_assignment

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def reference():
    training.make_deterministic()
    spec = small_spec()
    return spec, training.reference_run(spec)


async def test_two_trainers_end_bitwise_equal_to_reference(procs, tmp_path, reference):
    spec, want = reference
    primary, backup = procs.paramserver_pair()
    trainers = []
    for slot in range(spec.num_slots):
        path = write_assignment(
            tmp_path / f"a{slot}.json", "job-a", spec, slot, primary.address, [backup.address]
        )
        trainers.append(procs.trainer(f"tr{slot}", "--assignment-file", str(path)))
    for proc in trainers:
        assert await asyncio.to_thread(wait_exit, proc, 120) == 0, proc.log_tail()
    version, got = await final_weights([primary.address, backup.address], "job-a", spec)
    assert version == spec.steps
    assert_bitwise_equal(got, want)
    assert "fault fired" not in trainers[0].log_tail(200)


@pytest.mark.parametrize("fault", ["crash_at_step=5", "crash_after_push=5"])
async def test_a_trainer_killed_mid_job_is_replaced_without_changing_a_bit(
    procs, tmp_path, reference, fault
):
    spec, want = reference
    primary, backup = procs.paramserver_pair()
    job = "job-" + fault.split("=")[0].replace("_", "-")
    paths = [
        write_assignment(tmp_path / f"a{k}.json", job, spec, k, primary.address, [backup.address])
        for k in range(spec.num_slots)
    ]
    steady = procs.trainer("tr0", "--assignment-file", str(paths[0]))
    doomed = procs.trainer("tr1", "--assignment-file", str(paths[1]), faults=fault)
    assert await asyncio.to_thread(wait_exit, doomed, 120) == -9  # SIGKILL, as kill -9
    assert "fault fired" in doomed.log_tail(200)
    successor = procs.trainer("tr1b", "--assignment-file", str(paths[1]))
    for proc in (steady, successor):
        assert await asyncio.to_thread(wait_exit, proc, 120) == 0, proc.log_tail()
    version, got = await final_weights([primary.address, backup.address], job, spec)
    assert version == spec.steps
    assert_bitwise_equal(got, want)
