"""The CLI's torch-free copy of the built-in job defaults matches the models registry."""

from __future__ import annotations

import pytest

from stalwart.api import common
from stalwart.cli.jobs import BUILTIN_DEFAULTS, build_spec
from stalwart.models import default_spec


@pytest.mark.parametrize("model", sorted(BUILTIN_DEFAULTS))
def test_submit_defaults_equal_the_registry(model):
    got = build_spec(model, None, None, None, 0, None, None, 0.0, None, "sync", 0, 1, [])
    want = default_spec(model)
    assert got == want


def test_flags_override_defaults_and_model_args_parse():
    spec = build_spec("mlp", 2, 7, 8, 5, "sgd", 0.1, 0.9, 0.0, "sync", 0, 1, ["hidden=64"])
    assert (spec.num_slots, spec.steps, spec.batch_size, spec.seed) == (2, 7, 8, 5)
    assert spec.optimizer.kind == common.OPTIMIZER_KIND_SGD and spec.optimizer.momentum == 0.9
    assert dict(spec.model_args) == {"hidden": "64"}


def test_update_rule_flags_go_on_top_of_the_model_defaults():
    from stalwart.cli.trainflags import Reduction, TrainingFlags

    spec = build_spec("char-lm", None, None, None, 0, None, None, 0.0, None, "sync", 0, 1, [])
    none = {f: None for f in TrainingFlags.__dataclass_fields__}
    TrainingFlags(**{**none, "warmup_steps": 5, "reduction": Reduction.sum}).apply(spec)
    s = spec.optimizer.schedule
    assert (s.kind, s.warmup_steps, s.final_lr_ratio) == (common.LR_SCHEDULE_KIND_COSINE, 5, 0.1)
    assert spec.optimizer.reduction == common.GRAD_REDUCTION_SUM
    assert spec.optimizer.clip_grad_norm == 1.0 and spec.micro_batches == 2  # kept
    plain = build_spec("mlp", None, None, None, 0, None, None, 0.0, None, "sync", 0, 1, [])
    TrainingFlags(**none).apply(plain)
    assert plain == default_spec("mlp")  # no flag given: nothing changes


def test_local_sgd_and_nesterov_flags_fill_the_spec_and_the_summary():
    from stalwart.cli.trainflags import TrainingFlags, describe_rule

    spec = build_spec("mlp", None, None, None, 0, "sgd", 0.7, 0.9, None, "sync", 0, 1, [])
    none = {f: None for f in TrainingFlags.__dataclass_fields__}
    TrainingFlags(**{**none, "local_steps": 8, "local_lr": 0.2, "nesterov": True}).apply(spec)
    assert (spec.local_steps, spec.local_lr, spec.optimizer.nesterov) == (8, 0.2, True)
    assert describe_rule(spec) == " nesterov local-steps=8 local-lr=0.2"


def test_gradient_dtype_flag_fills_the_spec_and_the_summary():
    from stalwart.cli.trainflags import GradientDtype, TrainingFlags, describe_rule

    none = {f: None for f in TrainingFlags.__dataclass_fields__}
    spec = build_spec("mlp", None, None, None, 0, None, None, 0.0, None, "sync", 0, 1, [])
    TrainingFlags(**{**none, "gradient_dtype": GradientDtype.bfloat16}).apply(spec)
    assert spec.gradient_dtype == common.DTYPE_BFLOAT16
    assert describe_rule(spec) == " gradients=bfloat16"
    TrainingFlags(**{**none, "gradient_dtype": GradientDtype.float32}).apply(spec)
    assert spec.gradient_dtype == common.DTYPE_UNSPECIFIED and describe_rule(spec) == ""
