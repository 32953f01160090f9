"""Which computes run on the trainer's event loop (services/trainer/worker.py)."""

import pytest

from services.trainer.faults import Faults
from services.trainer.worker import INLINE_COMPUTE_S, computes_inline

NONE = Faults.parse("")


def test_a_short_compute_runs_inline_after_the_first():
    assert not computes_inline(None, NONE, pushing=False)  # a job's first: nothing known
    assert computes_inline(INLINE_COMPUTE_S / 10, NONE, pushing=False)


def test_a_long_compute_goes_to_the_executor():
    assert not computes_inline(INLINE_COMPUTE_S, NONE, pushing=False)
    assert not computes_inline(5.0, NONE, pushing=False)


def test_not_while_another_slots_push_is_in_flight():
    assert not computes_inline(INLINE_COMPUTE_S / 10, NONE, pushing=True)


@pytest.mark.parametrize("spec", ["delay_s=0.01", "heat_from_step=3", "hang_at_step=5"])
def test_not_with_a_fault_that_sleeps_in_the_compute(spec):
    faults = Faults.parse(spec)
    assert faults.sleeps
    assert not computes_inline(INLINE_COMPUTE_S / 10, faults, pushing=False)


@pytest.mark.parametrize("spec", ["", "crash_at_step=3", "flip_bit_at_step=2"])
def test_faults_that_do_not_sleep(spec):
    faults = Faults.parse(spec)
    assert not faults.sleeps
    assert computes_inline(INLINE_COMPUTE_S / 10, faults, pushing=False)
