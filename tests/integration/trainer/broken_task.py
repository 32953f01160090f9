"""User tasks with bugs, imported by trainers as ``tests.integration.trainer.broken_task:...``."""

from stalwart.models.mlp import MlpTask

ARGS = {"inputs": "8", "hidden": "16", "layers": "1"}


class LossRaises(MlpTask):
    def loss(self, model, x, y):
        raise ValueError("the loss went wrong")


class WrongShape(MlpTask):
    def batch(self, seed, slot, step, batch_size):
        x, y = super().batch(seed, slot, step, batch_size)
        return x[:, :3], y  # the model wants 8 inputs


class LossNaN(MlpTask):
    def loss(self, model, x, y):
        return super().loss(model, x, y) * float("nan")


def loss_nan(spec):
    return LossNaN(spec.seed, ARGS)


def loss_raises(spec):
    return LossRaises(spec.seed, ARGS)


def wrong_shape(spec):
    return WrongShape(spec.seed, ARGS)
