"""A user task for the registry tests, imported as ``tests.unit.training.user_task:make``."""

from stalwart.models.mlp import MlpTask


def make(spec):
    return MlpTask(spec.seed, {"inputs": "8", "hidden": "16", "layers": "1"})


def not_a_task(spec):
    return object()
