"""Built-in and user tasks: pure batches, seeded init, argument checks, sparse touches."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from stalwart import models
from stalwart.errors import ErrorKind, StalwartError
from stalwart.models import base

SMALL_ARGS = {
    "digits-cnn": {"width": "4"},
    "mlp": {"inputs": "16", "hidden": "32", "layers": "2"},
    "embedding": {"rows": "1000", "dim": "4", "touched": "8"},
}


def spec_for(name: str, **overrides):
    return models.default_spec(name, model_args=SMALL_ARGS[name], **overrides)


@pytest.mark.parametrize("name", sorted(SMALL_ARGS))
def test_batches_are_pure_functions_of_seed_slot_step(name):
    spec = spec_for(name, seed=5)
    first = models.resolve(spec).batch(5, 1, 7, 16)
    torch.manual_seed(1234)  # the global RNG must play no part
    torch.rand(10)
    again = models.resolve(spec).batch(5, 1, 7, 16)
    for a, b in zip(first, again, strict=True):
        assert torch.equal(a, b)
    for other in [(6, 1, 7), (5, 0, 7), (5, 1, 8)]:
        assert not torch.equal(models.resolve(spec).batch(*other, 16)[0], first[0])


@pytest.mark.parametrize("name", sorted(SMALL_ARGS))
def test_init_is_seeded_and_leaves_global_rng_alone(name):
    task = models.resolve(spec_for(name))
    torch.manual_seed(1)
    before = torch.random.get_rng_state()
    a, b = task.build_model(3), task.build_model(3)
    assert torch.equal(torch.random.get_rng_state(), before)
    for (na, pa), (nb, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert na == nb and torch.equal(pa, pb)
    c = task.build_model(4)
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters(), strict=True))


@pytest.mark.parametrize("name", sorted(SMALL_ARGS))
def test_loss_and_evaluate_run(name):
    spec = spec_for(name)
    task = models.resolve(spec)
    model = task.build_model(0)
    x, y = task.batch(0, 0, 0, 8)
    assert task.loss(model, x, y).dim() == 0
    metrics = task.evaluate(model)
    assert 0 <= metrics["accuracy"] <= 1


def test_derive_seed_separates_neighbours_and_takes_uint64():
    assert base.derive_seed(1, 0, 1) != base.derive_seed(1, 1, 0)
    assert base.derive_seed(2**64 - 1, 0) == base.derive_seed(2**64 - 1, 0)
    assert base.derive_seed("a", 1) != base.derive_seed("a1")


def test_mlp_parameter_count_follows_model_args():
    task = models.resolve(
        models.default_spec(
            "mlp", model_args={"inputs": "10", "hidden": "20", "layers": "3", "classes": "5"}
        )
    )
    n = sum(p.numel() for p in task.build_model(0).parameters())
    assert n == (10 * 20 + 20) + 2 * (20 * 20 + 20) + (20 * 5 + 5)


def test_embedding_touches_at_most_touched_rows():
    spec = models.default_spec("embedding", model_args={"rows": "5000", "touched": "16"})
    task = models.resolve(spec)
    model = task.build_model(0)
    x, y = task.batch(0, 0, 3, 256)
    assert len(x.unique()) <= 16
    task.loss(model, x, y).backward()
    touched_rows = (model.table.weight.grad.abs().sum(dim=1) > 0).sum().item()
    assert 0 < touched_rows <= 16


def test_digits_read_from_the_bundled_csv_equal_scikit_learns_loader():
    from sklearn.datasets import load_digits

    from stalwart.models import digits

    assert digits._bundled_csv() is not None  # else the fast path is never taken
    pixels, target = digits._digits_arrays()
    expected = load_digits()
    assert pixels.dtype == expected.data.dtype and pixels.shape == (1797, 64)
    assert np.array_equal(pixels, expected.data)
    assert np.array_equal(target, expected.target)


def test_digits_load_without_importing_sklearn_datasets():
    # The launcher's preload leaves scikit-learn out: a trainer's first digits batch
    # must not import it inside a recovery.
    code = (
        "import sys; from stalwart.models import digits; digits.split(0); "
        "print('sklearn.datasets' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "False"


def test_digits_split_is_fixed_and_disjoint():
    from stalwart.models import digits

    train_x, _, test_x, _ = digits.split(0)
    again = digits.split.__wrapped__(0)
    assert torch.equal(test_x, again[2])
    assert len(train_x) + len(test_x) == 1797
    assert len(test_x) == 359


@pytest.mark.parametrize(
    "spec, words",
    [
        (models.default_spec("nope"), "unknown model"),
        (models.default_spec("mlp", model_args={"hidden": "x"}), "integer"),
        (models.default_spec("mlp", model_args={"hidden": "0"}), "[1,"),
        (models.default_spec("mlp", model_args={"colour": "red"}), "unknown model_args"),
        (models.default_spec("embedding", model_args={"rows": "4", "touched": "8"}), "exceed"),
        (models.default_spec("mlp", dataset="imagenet"), "dataset"),
        (models.default_spec("no_such_pkg.mod:make"), "cannot import"),
        (models.default_spec("os.path;rm:x"), "package.module:function"),
        (models.default_spec("tests.unit.training.user_task:missing"), "no callable"),
        (models.default_spec("tests.unit.training.user_task:not_a_task"), "lacks"),
    ],
)
def test_bad_specs_are_invalid_argument(spec, words):
    with pytest.raises(StalwartError) as info:
        models.resolve(spec)
    assert info.value.kind is ErrorKind.INVALID_ARGUMENT
    assert words in info.value.message


def test_user_task_is_imported_from_the_local_path():
    task = models.resolve(models.default_spec("tests.unit.training.user_task:make"))
    assert isinstance(task, models.Task)
    assert task.build_model(0)[0].in_features == 8
