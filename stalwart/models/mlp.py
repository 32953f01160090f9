"""``mlp``: a multi-layer perceptron of configurable size on synthetic data, for benchmarks.

Inputs are standard normal; the label is the arg-max of a fixed random linear
"teacher" of the input, so the task is learnable and its loss falls. The
parameter count is ``inputs*hidden + (layers-1)*hidden^2 + hidden*classes``
plus biases, set through model_args.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import torch
from torch import nn

from stalwart import modelargs
from stalwart.models.base import accuracy_and_loss, generator, seeded_module

NAME = "mlp"
EVAL_EXAMPLES = 2048


@functools.lru_cache(maxsize=8)
def _teacher(seed: int, inputs: int, classes: int) -> torch.Tensor:
    return torch.randn(inputs, classes, generator=generator(seed, NAME, "teacher"))


class MlpTask:
    """model_args: ``inputs`` (256), ``hidden`` (1024), ``layers`` (4 hidden layers), ``classes`` (10)."""

    def __init__(self, seed: int, model_args: Mapping[str, str]):
        args = modelargs.parse(NAME, model_args)
        self.inputs, self.hidden = args["inputs"], args["hidden"]
        self.layers, self.classes = args["layers"], args["classes"]
        self.seed = seed

    def _network(self) -> nn.Module:
        dims = [self.inputs] + [self.hidden] * self.layers
        parts: list[nn.Module] = []
        for a, b in zip(dims, dims[1:], strict=False):
            parts += [nn.Linear(a, b), nn.ReLU()]
        parts.append(nn.Linear(dims[-1], self.classes))
        return nn.Sequential(*parts)

    def build_model(self, seed: int) -> nn.Module:
        return seeded_module(seed, self._network)

    def _examples(self, seed: int, n: int, g: torch.Generator):
        x = torch.randn(n, self.inputs, generator=g)
        y = (x @ _teacher(seed, self.inputs, self.classes)).argmax(dim=1)
        return x, y

    def batch(self, seed: int, slot: int, step: int, batch_size: int):
        return self._examples(seed, batch_size, generator(seed, slot, step))

    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(model(x), y)

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        # a key no (slot, step) pair can produce: held out by construction
        x, y = self._examples(self.seed, EVAL_EXAMPLES, generator(self.seed, NAME, "eval"))
        return accuracy_and_loss(model, x, y)
