"""A user task whose model is a single tensor (a linear map without bias), imported as
``tests.integration.cluster.one_tensor_task:make``: a job of it over two shard groups
leaves one group with nothing to hold."""

from __future__ import annotations

from torch import nn

from stalwart.models.mlp import MlpTask


class OneTensorTask(MlpTask):
    def _network(self) -> nn.Module:
        return nn.Linear(self.inputs, self.classes, bias=False)


def make(spec):
    return OneTensorTask(spec.seed, {"inputs": "16", "classes": "4"})
