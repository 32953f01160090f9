"""``embedding``: a recommendation-style model whose steps touch few embedding rows.

An ``nn.Embedding`` table of ``rows`` x ``dim`` feeds a small MLP that predicts
each item's class. Each (slot, step) batch first picks ``touched`` distinct rows
(without replacement), then draws its ``batch_size`` examples among them, so a
step's gradient is non-zero on at most ``touched`` rows per slot: the touched
fraction is ``num_slots * touched / rows`` at most. Gradients travel dense (the
wire has no sparse format); with plain SGD (no momentum, no weight decay) only
touched rows change, which is what delta checkpoints exploit. Adam moves rows
it has seen before even when untouched, because its moments decay.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import torch
from torch import nn

from stalwart import modelargs
from stalwart.models.base import accuracy_and_loss, generator, seeded_module

NAME = "embedding"
EVAL_EXAMPLES = 4096


@functools.lru_cache(maxsize=8)
def _labels(seed: int, rows: int, classes: int) -> torch.Tensor:
    """The hidden class of every item (row): what the model has to learn."""
    return torch.randint(classes, (rows,), generator=generator(seed, NAME, "labels"))


class _Recommender(nn.Module):
    def __init__(self, rows: int, dim: int, hidden: int, classes: int):
        super().__init__()
        self.table = nn.Embedding(rows, dim)
        self.head = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, classes))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.table(ids))


class EmbeddingTask:
    """model_args: ``rows`` (100000), ``dim`` (16), ``touched`` rows per batch (64),
    ``hidden`` (64), ``classes`` (8)."""

    def __init__(self, seed: int, model_args: Mapping[str, str]):
        args = modelargs.parse(NAME, model_args)
        self.rows, self.dim, self.touched = args["rows"], args["dim"], args["touched"]
        self.hidden, self.classes = args["hidden"], args["classes"]
        self.seed = seed

    def build_model(self, seed: int) -> nn.Module:
        return seeded_module(
            seed, lambda: _Recommender(self.rows, self.dim, self.hidden, self.classes)
        )

    def batch(self, seed: int, slot: int, step: int, batch_size: int):
        g = generator(seed, slot, step)
        rows = _distinct(self.rows, self.touched, g)
        ids = rows[torch.randint(len(rows), (batch_size,), generator=g)]
        return ids, _labels(seed, self.rows, self.classes)[ids]

    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(model(x), y)

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        # Accuracy on items seen at random: it rises as more rows get trained.
        g = generator(self.seed, NAME, "eval")
        ids = torch.randint(self.rows, (EVAL_EXAMPLES,), generator=g)
        return accuracy_and_loss(model, ids, _labels(self.seed, self.rows, self.classes)[ids])


def _distinct(n: int, k: int, g: torch.Generator) -> torch.Tensor:
    """``k`` distinct ids in [0, n): a full permutation when k is a large share, else
    rejection of repeats (cheap for k << n, and the table can be huge)."""
    if 4 * k >= n:
        return torch.randperm(n, generator=g)[:k]
    chosen: list[int] = []
    seen: set[int] = set()
    while len(chosen) < k:
        for i in torch.randint(n, (2 * (k - len(chosen)),), generator=g).tolist():
            if i not in seen and len(chosen) < k:
                seen.add(i)
                chosen.append(i)
    return torch.tensor(chosen, dtype=torch.int64)
