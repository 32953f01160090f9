"""Model name -> Task, and the default job settings of each built-in."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from stalwart.api import common, coordinator
from stalwart.modelargs import invalid
from stalwart.models import charlm, digits, embedding, mlp, user
from stalwart.models.base import Task

Factory = Callable[[int, Mapping[str, str]], Task]

BUILTINS: dict[str, Factory] = {
    digits.NAME: digits.DigitsTask,
    mlp.NAME: mlp.MlpTask,
    embedding.NAME: embedding.EmbeddingTask,
    charlm.NAME: charlm.CharLmTask,
}


def resolve(spec: coordinator.JobSpec) -> Task:
    """The Task a job spec names; INVALID_ARGUMENT (StalwartError) when it cannot.

    Cheap: no model is built and no data is read, so a coordinator can call it
    to validate a spec.
    """
    if spec.dataset and spec.dataset != spec.model:
        raise invalid(f"dataset {spec.dataset!r}: only each model's own dataset exists")
    factory = BUILTINS.get(spec.model)
    if factory is not None:
        return factory(spec.seed, spec.model_args)
    if user.is_reference(spec.model):
        return user.load(spec)
    raise invalid(
        f"unknown model {spec.model!r}: use one of {sorted(BUILTINS)} or package.module:function"
    )


def _adam(lr: float) -> common.OptimizerSpec:
    return common.OptimizerSpec(kind=common.OPTIMIZER_KIND_ADAM, lr=lr)


def _sgd(lr: float) -> common.OptimizerSpec:
    return common.OptimizerSpec(kind=common.OPTIMIZER_KIND_SGD, lr=lr)


def _charlm_adamw() -> common.OptimizerSpec:
    """AdamW, warmup + cosine, clipping at 1.0: how small transformers are trained."""
    return common.OptimizerSpec(
        kind=common.OPTIMIZER_KIND_ADAMW, lr=3e-3, weight_decay=0.01, beta2=0.95,
        clip_grad_norm=1.0,
        schedule=common.LrSchedule(kind=common.LR_SCHEDULE_KIND_COSINE, warmup_steps=30,
                                   final_lr_ratio=0.1),
    )  # fmt: skip


# Defaults per built-in; see docs/models.md for how digits-cnn's were chosen.
_DEFAULTS: dict[str, dict] = {
    digits.NAME: dict(num_slots=3, steps=400, batch_size=64, optimizer=_adam(2e-3)),
    mlp.NAME: dict(num_slots=1, steps=100, batch_size=64, optimizer=_adam(1e-3)),
    embedding.NAME: dict(num_slots=2, steps=100, batch_size=64, optimizer=_sgd(1.0)),
    charlm.NAME: dict(
        num_slots=2, steps=300, batch_size=16, micro_batches=2, optimizer=_charlm_adamw()
    ),  # fmt: skip
}


def default_spec(model: str = digits.NAME, **overrides) -> coordinator.JobSpec:
    """A complete sync-mode JobSpec with the built-in's defaults; keyword args override."""
    fields = dict(
        model=model,
        seed=0,
        consistency=common.ConsistencySpec(mode=common.CONSISTENCY_MODE_SYNC),
        num_shards=1,
    )
    fields.update(_DEFAULTS.get(model, {}))
    fields.update(overrides)
    return coordinator.JobSpec(**fields)
