"""When user-code errors fail a job (services/coordinator/taskerrors.py)."""

from __future__ import annotations

import pytest

from services.coordinator.taskerrors import TaskError, TaskErrors


def err(node="a", slot=0, step=3, phase="step", message="boom", location="task.py:9 in loss"):
    return TaskError(node, slot, step, phase, "ValueError", message, location)


def test_an_import_error_fails_at_once():
    reason = TaskErrors().record("j", err(phase="import", message="no module named x"))
    assert (
        reason == "the model cannot be loaded: ValueError: no module named x at task.py:9 in loss"
    )


def test_the_same_error_from_two_trainers_at_a_step_fails_the_job():
    errors = TaskErrors()
    assert errors.record("j", err("a", slot=0)) is None
    assert errors.record("j", err("a", slot=0)) is None  # the same trainer again
    reason = errors.record("j", err("b", slot=1))  # another trainer, another slot, same step
    assert reason == (
        "user code failed at step 3 (slot 1): ValueError: boom at task.py:9 in loss (on 2 trainers)"
    )


@pytest.mark.parametrize(
    "other",
    [
        err("b", step=4),
        err("b", message="other"),
        err("b", location="x.py:1"),
        err("b", phase="step", slot=0, step=3, message="boom "),
    ],
)
def test_different_errors_or_steps_do_not_add_up(other):
    errors = TaskErrors()
    assert errors.record("j", err("a")) is None
    assert errors.record("j", other) is None
    assert errors.record("other-job", err("b")) is None


def test_one_trainer_alone_fails_the_job_on_the_third_report():
    errors = TaskErrors(repeats=3)
    assert [errors.record("j", err("a")) for _ in range(2)] == [None, None]
    assert errors.record("j", err("a")).endswith("(3 times on a)")


def test_memory_is_bounded_and_forgotten_per_job():
    errors = TaskErrors(remembered=2)
    for step in range(5):
        errors.record("j", err("a", step=step))
    assert errors.record("j", err("b", step=0)) is None  # step 0 was dropped: counts anew
    assert errors.record("j", err("b", step=4)) is not None
    errors.forget("j")
    assert errors.record("j", err("b", step=4)) is None


def gpu_full(node: str, phase: str = "step") -> TaskError:
    message = "CUDA out of memory. Tried to allocate 2.00 GiB"
    return TaskError(node, 0, 3 if phase == "step" else -1, phase, "OutOfMemoryError", message)


@pytest.mark.parametrize("phase", ["step", "import"])
def test_a_machine_fault_fails_the_job_only_when_a_second_trainer_reports_it(phase):
    errors = TaskErrors(repeats=3)
    # another trainer could take the work: the reporter is drained, the job goes on
    assert [errors.record("j", gpu_full("a", phase), movable=True) for _ in range(5)] == [None] * 5
    assert "(on 2 trainers)" in errors.record("j", gpu_full("b", phase), movable=True)


def test_a_machine_fault_with_nobody_to_take_over_counts_as_before():
    assert TaskErrors().record("j", gpu_full("a", "import")).startswith("the model cannot")
    errors = TaskErrors(repeats=3)
    assert [errors.record("j", gpu_full("a")) for _ in range(2)] == [None, None]
    assert errors.record("j", gpu_full("a")).endswith("(3 times on a)")


@pytest.mark.parametrize(
    ("error_type", "message", "machine"),
    [
        ("OutOfMemoryError", "CUDA out of memory. Tried to allocate 20.00 MiB", True),
        ("AcceleratorError", "CUDA error: an illegal memory access was encountered", True),
        ("RuntimeError", "CUDA error: uncorrectable ECC error encountered", True),
        ("RuntimeError", "DefaultCPUAllocator: can't allocate memory: you tried 8 GB", True),
        ("RuntimeError", "mat1 and mat2 shapes cannot be multiplied (4x3 and 5x2)", False),
        ("ValueError", "boom", False),
    ],
)
def test_what_counts_as_a_machine_fault(error_type, message, machine):
    assert TaskError("a", 0, 3, "step", error_type, message).machine_fault is machine
