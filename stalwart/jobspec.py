"""Validation of job specs and optimizer specs, shared by the coordinator and paramservers.

Every check raises :class:`StalwartError` ``INVALID_ARGUMENT`` (or ``LIMIT_EXCEEDED``
for sizes over the limits) with a message naming the field, and never imports
user code: a ``package.module:function`` model is checked for syntax only; the
trainers import it from their own path.
"""

from __future__ import annotations

import math
import re

from stalwart import limits, modelargs, schedule
from stalwart.api import common, coordinator
from stalwart.errors import ErrorKind, StalwartError
from stalwart.modelargs import invalid

BUILTIN_MODELS = frozenset(modelargs.SCHEMAS)  # each built-in declares its model_args there
BUILTIN_DATASETS = frozenset({"", "digits", "synthetic"})
MAX_MICRO_BATCHES = 64
MAX_LOCAL_STEPS = 1024
MAX_PATH = 4096
# Shard groups one job may spread over. The leader walks a job's shards on every
# tick; a job asking for 2**31-1 of them held its event loop (and, after a failover,
# the next leader's) in that walk for good.
MAX_SHARDS = 256
# The paramserver steps float32 tensors: a hyper-parameter past float32's range
# (lr 1e300 is a finite double) failed every commit with an overflow.
FLOAT32_MAX = 3.4028234663852886e38
# What JobSpec.gradient_dtype may say: the parameters' own dtypes, or bfloat16 on the wire
GRADIENT_DTYPES = (common.DTYPE_UNSPECIFIED, common.DTYPE_BFLOAT16)

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_USER_MODEL = re.compile(rf"{_IDENT}(\.{_IDENT})*:{_IDENT}")
_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


def validate_optimizer(spec: common.OptimizerSpec) -> None:
    """The optimizer kinds and hyper-parameter ranges the paramserver runs (torch.optim's)."""
    kind = spec.kind
    if kind not in (
        common.OPTIMIZER_KIND_SGD,
        common.OPTIMIZER_KIND_ADAM,
        common.OPTIMIZER_KIND_ADAMW,
    ):
        raise invalid("optimizer: kind must be SGD, ADAM or ADAMW")
    if not 0 < spec.lr <= FLOAT32_MAX:  # NaN fails the comparison
        raise invalid(f"optimizer: lr must be > 0 and finite in float32, got {spec.lr}")
    if not 0 <= spec.weight_decay <= FLOAT32_MAX:
        raise invalid(
            f"optimizer: weight_decay must be >= 0 and finite in float32, got {spec.weight_decay}"
        )
    if kind == common.OPTIMIZER_KIND_SGD:
        _check_sgd(spec)
    else:
        _check_adam(spec)
    _check_update_rule(spec)


def _check_update_rule(spec: common.OptimizerSpec) -> None:
    """Reduction, clipping and schedule: what happens to the gradient before the step."""
    if spec.reduction not in _REDUCTIONS:
        raise invalid("optimizer: reduction must be MEAN or SUM")
    for name in ("clip_grad_norm", "clip_grad_value"):
        value = getattr(spec, name)
        if not value >= 0 or math.isinf(value):
            raise invalid(f"optimizer: {name} must be finite and >= 0 (0 disables), got {value}")
    if spec.HasField("schedule"):
        _check_schedule(spec.schedule)


_REDUCTIONS = (
    common.GRAD_REDUCTION_UNSPECIFIED,
    common.GRAD_REDUCTION_MEAN,
    common.GRAD_REDUCTION_SUM,
)
_SCHEDULES = (
    common.LR_SCHEDULE_KIND_UNSPECIFIED,
    common.LR_SCHEDULE_KIND_CONSTANT,
    common.LR_SCHEDULE_KIND_COSINE,
    common.LR_SCHEDULE_KIND_LINEAR,
    common.LR_SCHEDULE_KIND_STEP,
)


def _check_schedule(s: common.LrSchedule) -> None:
    if s.kind not in _SCHEDULES:
        raise invalid("optimizer.schedule: kind must be CONSTANT, COSINE, LINEAR or STEP")
    if s.warmup_steps < 0:
        raise invalid(f"optimizer.schedule: warmup_steps must be >= 0, got {s.warmup_steps}")
    decaying = s.kind in (common.LR_SCHEDULE_KIND_COSINE, common.LR_SCHEDULE_KIND_LINEAR)
    if decaying and s.decay_steps < 1:
        raise invalid(f"optimizer.schedule: decay_steps must be >= 1, got {s.decay_steps}")
    if not 0 <= s.final_lr_ratio <= 1:
        raise invalid(
            f"optimizer.schedule: final_lr_ratio must be in [0, 1], got {s.final_lr_ratio}"
        )
    if s.kind == common.LR_SCHEDULE_KIND_STEP:
        if s.step_size < 1:
            raise invalid(f"optimizer.schedule: step_size must be >= 1, got {s.step_size}")
        if not 0 <= s.gamma <= 1:
            raise invalid(f"optimizer.schedule: gamma must be in (0, 1] (0: 0.1), got {s.gamma}")


def _check_sgd(spec: common.OptimizerSpec) -> None:
    if not 0 <= spec.momentum < 1:
        raise invalid(f"optimizer: momentum must be in [0, 1), got {spec.momentum}")
    if not 0 <= spec.dampening <= 1:
        raise invalid(f"optimizer: dampening must be in [0, 1], got {spec.dampening}")
    if spec.nesterov and (spec.momentum <= 0 or spec.dampening != 0):
        raise invalid("optimizer: nesterov needs momentum > 0 and dampening 0")
    if spec.beta1 or spec.beta2 or spec.eps:
        raise invalid("optimizer: beta1, beta2 and eps do not apply to SGD")


def _check_adam(spec: common.OptimizerSpec) -> None:
    for name in ("beta1", "beta2"):
        value = getattr(spec, name)
        if not 0 <= value < 1:
            raise invalid(f"optimizer: {name} must be in [0, 1), got {value}")
    if not 0 <= spec.eps <= FLOAT32_MAX:
        raise invalid(f"optimizer: eps must be >= 0 and finite in float32, got {spec.eps}")
    if spec.momentum or spec.dampening or spec.nesterov:
        raise invalid("optimizer: momentum, dampening and nesterov do not apply to Adam")


def validate_model_name(model: str) -> None:
    """A built-in model name, or ``package.module:function`` (syntax only)."""
    if model in BUILTIN_MODELS or _USER_MODEL.fullmatch(model):
        return
    known = ", ".join(sorted(BUILTIN_MODELS))
    raise invalid(f"unknown model {model[:100]!r}: use one of {known} or 'package.module:function'")


def validate_job_id(job_id: str) -> None:
    if job_id and not _JOB_ID.fullmatch(job_id):
        raise invalid(
            "job_id must be 1-63 characters of A-Z a-z 0-9 . _ - starting with a letter or digit"
        )


def validate_job_spec(spec: coordinator.JobSpec, max_slots: int, max_steps: int) -> None:
    """Everything a coordinator checks before admitting a job."""
    limits.check_string("model", spec.model, limits.MAX_MODEL_NAME)
    limits.check_string("dataset", spec.dataset, limits.MAX_DATASET)
    limits.check_map("model_args", spec.model_args)
    validate_model_name(spec.model)
    user_model = ":" in spec.model
    if not user_model and spec.dataset not in BUILTIN_DATASETS:
        raise invalid(f"unknown dataset {spec.dataset[:100]!r} for built-in model {spec.model!r}")
    if not user_model:
        modelargs.parse(spec.model, spec.model_args)  # a user task reads its own on trainers
    _check_counts(spec, max_slots, max_steps)
    validate_optimizer(spec.optimizer)
    if spec.optimizer.clip_grad_norm and spec.num_shards > 1:
        raise invalid("optimizer: clip_grad_norm needs num_shards 1 (the norm spans every tensor)")
    _check_consistency(spec.consistency)
    if spec.consistency.mode != common.CONSISTENCY_MODE_SYNC and spec.num_shards > 1:
        # Each group counts a slot's pushes on its own; a trainer that takes over a
        # slot learns one count, and a push applied on some groups only would leave
        # the counts apart for good (sync finishes such a step instead).
        raise invalid("consistency ASYNC and SSP need num_shards 1")
    if len(spec.init_from) > MAX_PATH or (
        spec.init_from and not spec.init_from.endswith(".safetensors")
    ):
        raise invalid(f"init_from must be a .safetensors path of at most {MAX_PATH} characters")
    if not 0 <= spec.duplicate_compute_rate <= 1:
        raise invalid(
            f"duplicate_compute_rate must be in [0, 1], got {spec.duplicate_compute_rate}"
        )
    if spec.gradient_dtype not in GRADIENT_DTYPES:
        names = " or ".join(common.Dtype.Name(d) for d in GRADIENT_DTYPES)
        raise invalid(f"gradient_dtype must be {names}, got {spec.gradient_dtype}")


def _check_counts(spec: coordinator.JobSpec, max_slots: int, max_steps: int) -> None:
    if spec.num_slots < 1:
        raise invalid(f"num_slots must be >= 1, got {spec.num_slots}")
    if spec.steps < 1:
        raise invalid(f"steps must be >= 1, got {spec.steps}")
    if spec.batch_size < 1:
        raise invalid(f"batch_size must be >= 1, got {spec.batch_size}")
    if not 0 <= spec.micro_batches <= MAX_MICRO_BATCHES:
        raise invalid(
            f"micro_batches must be in [0, {MAX_MICRO_BATCHES}], got {spec.micro_batches}"
        )
    _check_local_steps(spec)
    for name in ("num_shards", "checkpoint_interval"):
        if getattr(spec, name) < 0:
            raise invalid(f"{name} must be >= 0, got {getattr(spec, name)}")
    if spec.eval_every < 0:
        raise invalid(f"eval_every must be >= 0 (0: no evaluation), got {spec.eval_every}")
    if spec.num_shards > MAX_SHARDS:
        raise StalwartError(
            ErrorKind.LIMIT_EXCEEDED, f"num_shards {spec.num_shards} > limit {MAX_SHARDS}"
        )
    if spec.num_slots > max_slots:
        raise StalwartError(
            ErrorKind.LIMIT_EXCEEDED, f"num_slots {spec.num_slots} > limit {max_slots}"
        )
    if spec.steps > max_steps:
        raise StalwartError(ErrorKind.LIMIT_EXCEEDED, f"steps {spec.steps} > limit {max_steps}")


def _check_local_steps(spec: coordinator.JobSpec) -> None:
    """local_steps in range; local_lr set exactly when there are inner steps to take.

    A local_lr without local_steps is refused rather than ignored: it says the
    user meant local SGD and forgot the count. Micro-batches combine with it
    (each inner step accumulates them), so that pair is allowed.
    """
    if not 0 <= spec.local_steps <= MAX_LOCAL_STEPS:
        raise invalid(f"local_steps must be in [0, {MAX_LOCAL_STEPS}], got {spec.local_steps}")
    if spec.local_steps > 1:
        if not 0 < spec.local_lr <= FLOAT32_MAX:  # NaN fails the comparison
            raise invalid(
                f"local_lr must be > 0 and finite when local_steps > 1, got {spec.local_lr}"
            )
        if spec.consistency.mode not in (
            common.CONSISTENCY_MODE_UNSPECIFIED,
            common.CONSISTENCY_MODE_SYNC,
        ):
            raise invalid("local_steps > 1 needs consistency mode SYNC")
    elif spec.local_lr:
        raise invalid(f"local_lr {spec.local_lr} needs local_steps > 1, got {spec.local_steps}")


def _check_consistency(spec: common.ConsistencySpec) -> None:
    if spec.mode not in (
        common.CONSISTENCY_MODE_SYNC,
        common.CONSISTENCY_MODE_ASYNC,
        common.CONSISTENCY_MODE_SSP,
    ):
        raise invalid("consistency.mode must be SYNC, ASYNC or SSP")
    if spec.mode == common.CONSISTENCY_MODE_SSP and spec.staleness < 0:
        raise invalid("consistency.staleness must be >= 0 in SSP mode")
    if spec.mode != common.CONSISTENCY_MODE_SSP and spec.staleness:  # it would do nothing
        mode = common.ConsistencyMode.Name(spec.mode).removeprefix("CONSISTENCY_MODE_")
        raise invalid(f"consistency.staleness applies to SSP mode only, got {spec.staleness} "
                   f"with {mode}")  # fmt: skip


# Server-side defaults of the optional JobSpec fields, per built-in model (the
# CLI shows and sends the same ones; stalwart.models.registry.default_spec has
# them too, and a unit test keeps the three equal). protos/stalwart/v1/
# coordinator.proto documents them on JobSpec. Plain data: no torch import.
MODEL_DEFAULTS: dict[str, dict] = {
    "digits-cnn": dict(slots=3, steps=400, batch_size=64, optimizer="adam", lr=2e-3),
    "mlp": dict(slots=1, steps=100, batch_size=64, optimizer="adam", lr=1e-3),
    "embedding": dict(slots=2, steps=100, batch_size=64, optimizer="sgd", lr=1.0),
    "char-lm": dict(slots=2, steps=300, batch_size=16, optimizer="adamw", lr=3e-3),
}
# Defaults of a model past those five, as the JobSpec fields they fill when unset
# (zero): char-lm is trained as small transformers are (AdamW, warmup + cosine,
# clipping, two micro-batches).
MODEL_EXTRAS: dict[str, coordinator.JobSpec] = {
    "char-lm": coordinator.JobSpec(
        micro_batches=2,
        optimizer=common.OptimizerSpec(
            weight_decay=0.01, beta2=0.95, clip_grad_norm=1.0,
            schedule=common.LrSchedule(kind=common.LR_SCHEDULE_KIND_COSINE, warmup_steps=30,
                                       final_lr_ratio=0.1),
        ),
    ),
}  # fmt: skip
# For user models ("package.module:function").
FALLBACK_DEFAULTS = dict(slots=1, steps=100, batch_size=64, optimizer="adam", lr=1e-3)
OPTIMIZER_KINDS = {
    "sgd": common.OPTIMIZER_KIND_SGD,
    "adam": common.OPTIMIZER_KIND_ADAM,
    "adamw": common.OPTIMIZER_KIND_ADAMW,
}


def normalized(spec: coordinator.JobSpec) -> coordinator.JobSpec:
    """A copy with the documented defaults filled in: the one place the coordinator applies them.

    A zero (proto3's "not set") num_slots, steps, batch_size, optimizer kind or
    learning rate takes the model's default, and so do the fields of its
    MODEL_EXTRAS; an unspecified consistency mode is SYNC; num_shards 0 is 1. A
    model's default clip_grad_norm is left out of a job over several shard groups
    (the norm would span them); one asked for is kept, and refused by validation.
    Values that are set are left for validation.
    """
    out = coordinator.JobSpec()
    out.CopyFrom(spec)
    defaults = MODEL_DEFAULTS.get(out.model, FALLBACK_DEFAULTS)
    if out.num_slots == 0:
        out.num_slots = defaults["slots"]
    if out.steps == 0:
        out.steps = defaults["steps"]
    if out.batch_size == 0:
        out.batch_size = defaults["batch_size"]
    if out.optimizer.kind == common.OPTIMIZER_KIND_UNSPECIFIED:
        out.optimizer.kind = OPTIMIZER_KINDS[defaults["optimizer"]]
    if out.optimizer.lr == 0:
        out.optimizer.lr = defaults["lr"]
    if out.consistency.mode == common.CONSISTENCY_MODE_UNSPECIFIED:
        out.consistency.mode = common.CONSISTENCY_MODE_SYNC
    if out.num_shards == 0:
        out.num_shards = 1
    _fill_unset(out, model_extras(out.model, out.num_shards))
    out.optimizer.CopyFrom(schedule.resolved(out.optimizer, out.steps))
    return out


def model_extras(model: str, num_shards: int) -> coordinator.JobSpec:
    """The model's MODEL_EXTRAS for a job over ``num_shards`` groups. A default
    clip_grad_norm is left out of a sharded job: validation refuses global-norm
    clipping there (the norm would span the groups), and the user did not ask for it."""
    extras = coordinator.JobSpec()
    if model in MODEL_EXTRAS:
        extras.CopyFrom(MODEL_EXTRAS[model])
    if num_shards > 1:
        extras.optimizer.ClearField("clip_grad_norm")
    return extras


def _fill_unset(out, defaults) -> None:
    """Set each field ``defaults`` sets where ``out`` still has proto3's zero value."""
    for field, value in defaults.ListFields():
        if field.message_type is not None:
            _fill_unset(getattr(out, field.name), value)
        elif not getattr(out, field.name):
            setattr(out, field.name, value)
