"""The CLI's torch-free copy of the built-in job defaults matches the models registry."""

from __future__ import annotations

import pytest

from stalwart.api import common
from stalwart.cli.jobs import BUILTIN_DEFAULTS, build_spec
from stalwart.models import default_spec


@pytest.mark.parametrize("model", sorted(BUILTIN_DEFAULTS))
def test_submit_defaults_equal_the_registry(model):
    got = build_spec(model, None, None, None, 0, None, None, 0.0, 0.0, "sync", 0, 1, [])
    want = default_spec(model)
    assert got == want


def test_flags_override_defaults_and_model_args_parse():
    spec = build_spec("mlp", 2, 7, 8, 5, "sgd", 0.1, 0.9, 0.0, "sync", 0, 1, ["hidden=64"])
    assert (spec.num_slots, spec.steps, spec.batch_size, spec.seed) == (2, 7, 8, 5)
    assert spec.optimizer.kind == common.OPTIMIZER_KIND_SGD and spec.optimizer.momentum == 0.9
    assert dict(spec.model_args) == {"hidden": "64"}
