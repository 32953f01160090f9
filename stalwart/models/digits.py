"""``digits-cnn``: scikit-learn's bundled 8x8 handwritten digits and a small CNN.

Real data with no download (the 1,797 images ship inside scikit-learn). The
train/test split is a seeded permutation, so every process agrees on it; each
batch samples training images with replacement from a generator keyed by
(seed, slot, step).
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from torch import nn

from stalwart import modelargs
from stalwart.models.base import accuracy_and_loss, generator, seeded_module

NAME = "digits-cnn"
TEST_FRACTION = 0.2


@functools.lru_cache(maxsize=1)
def _all_digits() -> tuple[torch.Tensor, torch.Tensor]:
    pixels, target = _digits_arrays()
    # pixel values are 0..16; scale to [0, 1] and add the channel dimension
    x = torch.tensor(pixels.reshape(-1, 8, 8), dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(target, dtype=torch.int64)
    return x, y


def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """(pixels: 1797 x 64 float64, labels) as ``sklearn.datasets.load_digits`` gives them.

    Read straight from the CSV scikit-learn ships, found without importing it:
    ``sklearn.datasets`` costs 2.5-4 s of import, which every service forked from the
    launcher would otherwise share in its start-up (or a trainer pay inside a
    recovery), for one 60 KB file. Where the file is not where this scikit-learn keeps
    it, scikit-learn's own loader reads it."""
    path = _bundled_csv()
    if path is None:
        from sklearn.datasets import load_digits  # only if the file moved

        data = load_digits()
        return data.data, data.target
    with gzip.open(path, mode="rt", encoding="utf-8") as text:
        table = np.loadtxt(text, delimiter=",")
    return table[:, :-1], table[:, -1].astype(int)


def _bundled_csv() -> Path | None:
    spec = importlib.util.find_spec("sklearn")  # locates the package, runs none of it
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = Path(root) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            return path
    return None


@functools.lru_cache(maxsize=8)
def split(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(train_x, train_y, test_x, test_y) for a job seed; fixed for that seed."""
    x, y = _all_digits()
    order = torch.randperm(len(x), generator=generator(seed, NAME, "split"))
    n_test = int(len(x) * TEST_FRACTION)
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def _network(width: int) -> nn.Module:
    # A strided convolution rather than max-pooling: its backward is deterministic
    # on CUDA as well, which bitwise-equal runs need.
    return nn.Sequential(
        nn.Conv2d(1, width, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(width, 2 * width, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(2 * width * 4 * 4, 128),
        nn.ReLU(),
        nn.Linear(128, 10),
    )


def _shift(images: torch.Tensor, g: torch.Generator, pad: int = 1) -> torch.Tensor:
    """Move each image by up to ``pad`` pixels each way (zero fill), drawn from ``g``.

    1,437 training images are few; random shifts keep the CNN from memorising
    them and are worth about a point of held-out accuracy.
    """
    n, side = len(images), images.shape[-1]
    padded = nn.functional.pad(images, (pad, pad, pad, pad))
    offsets = torch.randint(2 * pad + 1, (n, 2), generator=g).tolist()
    return torch.stack(
        [padded[i, :, r : r + side, c : c + side] for i, (r, c) in enumerate(offsets)]
    )


class DigitsTask:
    """model_args: ``width`` (channels of the first convolution, default 32)."""

    def __init__(self, seed: int, model_args: Mapping[str, str]):
        self.width = modelargs.parse(NAME, model_args)["width"]
        self.seed = seed

    def build_model(self, seed: int) -> nn.Module:
        return seeded_module(seed, lambda: _network(self.width))

    def batch(self, seed: int, slot: int, step: int, batch_size: int):
        train_x, train_y, _, _ = split(seed)
        g = generator(seed, slot, step)
        idx = torch.randint(len(train_x), (batch_size,), generator=g)
        return _shift(train_x[idx], g), train_y[idx]

    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(model(x), y)

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        _, _, test_x, test_y = split(self.seed)
        return accuracy_and_loss(model, test_x, test_y)
