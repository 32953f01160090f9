"""A user task whose model draws random numbers and keeps buffers in training: batch norm
(running statistics), LayerNorm and dropout.

Imported as ``tests.unit.training.dropout_task:make`` by the unit tests and by
trainer processes in the integration tests (from their own path).
"""

from torch import nn

from stalwart.models.mlp import MlpTask

DROPOUT = 0.25


class DropoutTask(MlpTask):
    def _network(self) -> nn.Module:
        return nn.Sequential(
            nn.Linear(self.inputs, self.hidden),
            nn.BatchNorm1d(self.hidden),
            nn.LayerNorm(self.hidden),
            nn.ReLU(),
            nn.Dropout(DROPOUT),
            nn.Linear(self.hidden, self.classes),
        )


def make(spec):
    return DropoutTask(spec.seed, {"inputs": "8", "hidden": "32", "classes": "4"})
