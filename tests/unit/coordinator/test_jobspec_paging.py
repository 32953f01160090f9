"""Job-spec validation (stalwart.jobspec) and page tokens."""

from __future__ import annotations

import random

import pytest

from stalwart import jobspec, paging
from stalwart.api import common, coordinator
from stalwart.errors import ErrorKind, StalwartError


def spec(**changes) -> coordinator.JobSpec:
    s = coordinator.JobSpec(model="digits-cnn", num_slots=2, steps=10, batch_size=8,
                            optimizer=common.OptimizerSpec(kind=common.OPTIMIZER_KIND_SGD, lr=0.1))  # fmt: skip
    for name, value in changes.items():
        if name.startswith("opt_"):
            setattr(s.optimizer, name[4:], value)
        else:
            setattr(s, name, value)
    return jobspec.normalized(s)


@pytest.mark.parametrize(
    ("changes", "kind", "words"),
    [  # zero means "the default" (jobspec.normalized), so the bad counts are negative
        ({"model": "resnet9000"}, ErrorKind.INVALID_ARGUMENT, "unknown model"),
        ({"model": "my pkg:f"}, ErrorKind.INVALID_ARGUMENT, "unknown model"),
        ({"num_slots": -1}, ErrorKind.INVALID_ARGUMENT, "num_slots"),
        ({"steps": -1}, ErrorKind.INVALID_ARGUMENT, "steps"),
        ({"batch_size": -1}, ErrorKind.INVALID_ARGUMENT, "batch_size"),
        ({"opt_lr": -0.1}, ErrorKind.INVALID_ARGUMENT, "lr"),
        ({"opt_lr": float("nan")}, ErrorKind.INVALID_ARGUMENT, "lr"),
        ({"opt_momentum": 1.0}, ErrorKind.INVALID_ARGUMENT, "momentum"),
        ({"opt_beta1": 0.9}, ErrorKind.INVALID_ARGUMENT, "do not apply to SGD"),
        ({"duplicate_compute_rate": 1.5}, ErrorKind.INVALID_ARGUMENT, "duplicate_compute_rate"),
        ({"num_slots": 5000}, ErrorKind.LIMIT_EXCEEDED, "limit"),
        ({"dataset": "imagenet"}, ErrorKind.INVALID_ARGUMENT, "dataset"),
        ({"gradient_dtype": common.DTYPE_FLOAT16}, ErrorKind.INVALID_ARGUMENT, "gradient_dtype"),
        ({"gradient_dtype": 99}, ErrorKind.INVALID_ARGUMENT, "DTYPE_BFLOAT16"),
        # finite doubles the paramserver's float32 step cannot hold, and infinities
        ({"opt_lr": 1e300}, ErrorKind.INVALID_ARGUMENT, "finite in float32"),
        ({"opt_weight_decay": float("inf")}, ErrorKind.INVALID_ARGUMENT, "weight_decay"),
        ({"opt_weight_decay": 1e39}, ErrorKind.INVALID_ARGUMENT, "weight_decay"),
        ({"num_shards": 2**31 - 1}, ErrorKind.LIMIT_EXCEEDED, "num_shards"),
        ({"num_shards": jobspec.MAX_SHARDS + 1}, ErrorKind.LIMIT_EXCEEDED, "num_shards"),
    ],
)
def test_bad_specs(changes, kind, words):
    with pytest.raises(StalwartError) as info:
        jobspec.validate_job_spec(spec(**changes), max_slots=1024, max_steps=10**9)
    assert info.value.kind is kind and words in info.value.message


@pytest.mark.parametrize(
    ("model", "args", "words"),
    [  # refused at admission: every trainer would fail to build the model
        ("mlp", {"layers": "0"}, "model_args['layers'] must be in [1, 64], got 0"),
        ("digits-cnn", {"width": "wide"}, "model_args['width'] must be an integer, got 'wide'"),
        ("digits-cnn", {"depth": "3"}, "unknown model_args ['depth']; known: ['width']"),
        ("char-lm", {"dim": "10", "heads": "4"}, "dim 10 must be a multiple of heads 4"),
        ("embedding", {"rows": "8", "touched": "9"}, "touched (9) must not exceed rows (8)"),
    ],
)
def test_bad_model_args_of_a_built_in_are_refused(model, args, words):
    s = spec(model=model)
    s.model_args.update(args)
    with pytest.raises(StalwartError) as info:
        jobspec.validate_job_spec(s, 1024, 10**9)
    assert info.value.kind is ErrorKind.INVALID_ARGUMENT and words in info.value.message


def test_every_built_in_task_has_its_model_args_declared():
    from stalwart.models.registry import BUILTINS  # imports torch: the coordinator does not

    assert set(BUILTINS) == jobspec.BUILTIN_MODELS


def test_model_args_of_a_user_task_are_left_to_it():
    s = spec(model="mypkg.models:build")
    s.model_args.update({"anything": "goes"})
    jobspec.validate_job_spec(s, 1024, 10**9)


@pytest.mark.parametrize("model", ["digits-cnn", "mlp", "embedding", "mypkg.models:build", "m:f"])
def test_good_specs(model):
    s = spec(model=model)
    jobspec.validate_job_spec(s, 1024, 10**9)
    assert s.consistency.mode == common.CONSISTENCY_MODE_SYNC  # the default filled in


@pytest.mark.parametrize("eps", [float("inf"), 1e39, float("nan")])
def test_adam_eps_must_fit_float32(eps):
    s = spec()
    s.optimizer.Clear()
    s.optimizer.MergeFrom(common.OptimizerSpec(kind=common.OPTIMIZER_KIND_ADAM, lr=1e-3, eps=eps))
    with pytest.raises(StalwartError, match="eps must be >= 0 and finite in float32"):
        jobspec.validate_job_spec(s, 1024, 10**9)


def test_staleness_outside_ssp_is_refused_not_ignored():
    s = spec()
    s.consistency.staleness = 5  # normalized() made the mode SYNC
    with pytest.raises(StalwartError, match="staleness applies to SSP mode only, got 5 with SYNC"):
        jobspec.validate_job_spec(s, 1024, 10**9)
    s.consistency.staleness = -1
    s.consistency.mode = common.CONSISTENCY_MODE_SSP
    with pytest.raises(StalwartError, match="staleness must be >= 0 in SSP mode"):
        jobspec.validate_job_spec(s, 1024, 10**9)


@pytest.mark.parametrize("mode", [common.CONSISTENCY_MODE_ASYNC, common.CONSISTENCY_MODE_SSP])
def test_unsynced_modes_need_one_shard_group(mode):
    # each group counts a slot's pushes on its own: a push applied on some groups only
    # would leave the counts apart, and a trainer taking the slot over learns one
    s = spec()
    s.consistency.mode = mode
    jobspec.validate_job_spec(s, 1024, 10**9)
    s.num_shards = 2
    with pytest.raises(StalwartError, match="ASYNC and SSP need num_shards 1") as err:
        jobspec.validate_job_spec(s, 1024, 10**9)
    assert err.value.kind is ErrorKind.INVALID_ARGUMENT


def test_the_largest_values_allowed_are_valid():
    s = spec(num_shards=jobspec.MAX_SHARDS, opt_lr=jobspec.FLOAT32_MAX)
    jobspec.validate_job_spec(s, 1024, 10**9)


def test_bfloat16_gradients_on_the_wire_are_a_valid_choice():
    jobspec.validate_job_spec(spec(gradient_dtype=common.DTYPE_BFLOAT16), 1024, 10**9)


def test_pages_cover_everything_once_even_with_inserts():
    items = list(range(25))
    seen, token = [], ""
    while True:
        chunk, token = paging.page(items, lambda i: [i], 10, token)
        seen += chunk
        items.append(-1)  # sorts first: must not shift later pages
        if not token:
            break
    assert seen == list(range(25))


def test_bad_token():
    with pytest.raises(StalwartError):
        paging.page([1], lambda i: [i], 10, "not-base64!!")


def test_a_deeply_nested_token_is_refused_not_a_crash():
    token = paging.base64.urlsafe_b64encode(b'{"a":' * 5000).decode()
    with pytest.raises(StalwartError) as err:
        paging.page([1], lambda i: [i], 10, token)
    assert err.value.kind is ErrorKind.INVALID_ARGUMENT and err.value.message == "bad page_token"


def test_pages_are_the_full_sort_cut_in_pages():
    rng = random.Random(7)
    items = [(rng.randrange(30), f"id-{n:03d}") for n in range(500)]  # keys end unique
    seen, token = [], ""
    while True:
        chunk, token = paging.page(items, lambda i: [-i[0], i[1]], 37, token)
        assert len(chunk) == 37 or not token
        seen += chunk
        if not token:
            break
    assert seen == sorted(items, key=lambda i: (-i[0], i[1]))


def test_a_token_of_another_shape_is_refused():
    token = paging.encode(["not a number"])
    with pytest.raises(StalwartError) as err:
        paging.page([1, 2], lambda i: [i], 10, token)
    assert err.value.kind is ErrorKind.INVALID_ARGUMENT
