"""Jobs to train: built-in tasks (``digits-cnn``, ``mlp``, ``embedding``, ``char-lm``) and user tasks.

task = resolve(spec)                      # spec: stalwart.api.coordinator.JobSpec
model = task.build_model(spec.seed)       # same weights on every machine
x, y = task.batch(spec.seed, slot, step, spec.batch_size)   # pure function
task.loss(model, x, y).backward()
task.evaluate(model)                      # {"accuracy": ..., "loss": ...}
"""

from stalwart.models.base import Task, derive_seed, generator
from stalwart.models.registry import BUILTINS, default_spec, resolve

__all__ = ["BUILTINS", "Task", "default_spec", "derive_seed", "generator", "resolve"]
