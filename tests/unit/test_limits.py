"""The limits table: validation and the servers' receive limits come from it."""

from __future__ import annotations

import pytest

from stalwart import jobspec, limits
from stalwart.api import common, coordinator
from stalwart.errors import ErrorKind, StalwartError


def _largest_valid_spec() -> coordinator.JobSpec:
    n = limits.MAX_MAP_ENTRIES
    args = {f"{i:0{limits.MAX_MAP_KEY}d}": "v" * limits.MAX_MAP_VALUE for i in range(n)}
    return coordinator.JobSpec(
        model="m" * (limits.MAX_MODEL_NAME - 2) + ":f",
        model_args=args,
        dataset="d" * limits.MAX_DATASET,
        num_slots=1, steps=1, batch_size=1,
        optimizer=common.OptimizerSpec(kind=common.OPTIMIZER_KIND_SGD, lr=0.1),
    )  # fmt: skip


def test_the_largest_valid_create_job_fits_the_coordinator_receive_limit():
    spec = _largest_valid_spec()
    jobspec.validate_job_spec(jobspec.normalized(spec), 1024, 10**9)  # valid at every limit
    request = coordinator.CreateJobRequest(
        job_id="j" * 63, spec=spec, request_id="r" * limits.MAX_ID
    )
    size = request.ByteSize()
    assert size < 150 * 1024
    assert size < limits.max_request_bytes(["stalwart.v1.CoordinatorService"], 8 << 20)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda s: s.model_args.__setitem__("k", "v" * (limits.MAX_MAP_VALUE + 1)), "model_args"),
        (lambda s: s.model_args.update({str(i): "" for i in range(100)}), "entries"),
        (lambda s: setattr(s, "dataset", "d" * (limits.MAX_DATASET + 1)), "dataset"),
    ],
)
def test_over_a_string_limit_is_refused_with_resource_exhausted(change, words):
    spec = _largest_valid_spec()
    spec.model_args.clear()
    change(spec)
    with pytest.raises(StalwartError) as info:
        jobspec.validate_job_spec(jobspec.normalized(spec), 1024, 10**9)
    assert info.value.kind is ErrorKind.LIMIT_EXCEEDED and words in info.value.message


def test_receive_limit_by_service():
    default = 8 << 20
    assert limits.max_request_bytes(["stalwart.v1.CoordinatorService"], default) == 256 * 1024
    assert limits.max_request_bytes(["stalwart.v1.ParamServerService"], default) == default
    # the configured message size caps every entry of the table
    assert limits.max_request_bytes(["stalwart.v1.HealthMonitorService"], 512 * 1024) == 512 * 1024
