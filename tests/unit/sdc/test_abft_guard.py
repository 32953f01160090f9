"""The ABFT guard on a model: checks deferred to the end of the backward, kept
weight norms, layers called several times, long and 3-D batches, accumulation."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from stalwart import abft, training

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def _deterministic():
    training.make_deterministic()


def _mlp(seed: int = 0, d_in: int = 64, hidden: int = 128, d_out: int = 8) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, d_out))


def _batch(seed: int = 1, n: int = 32, d_in: int = 64, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(n, d_in, generator=torch.Generator().manual_seed(seed)) * scale


def _flip(t: torch.Tensor, index: int, bit: int) -> torch.Tensor:
    """A copy of t with one bit of one float32 element flipped."""
    t = t.clone()
    t.view(-1).view(torch.int32)[index] ^= 1 << bit
    return t


class _Corrupter:
    """A forward hook (registered before the guard's) that flips a bit of y when
    armed: of element ``index``, or of the largest element when it is None."""

    def __init__(self, module: nn.Module, index: int | None = 37, bit: int = 30):
        self.armed, self.index, self.bit = False, index, bit
        module.register_forward_hook(self)

    def __call__(self, _module, _inputs, out):
        if self.armed:
            index = int(out.abs().argmax()) if self.index is None else self.index
            return _flip(out, index, self.bit)
        return None


def _step(model: nn.Module, x: torch.Tensor) -> None:
    model.zero_grad(set_to_none=True)
    model(x).square().mean().backward()


def test_a_corrupted_output_raises_from_backward_before_gradients_are_read():
    model = _mlp()
    corrupter = _Corrupter(model[0])
    stats, _ = abft.protect(model)
    _step(model, _batch())
    assert (stats.checks, stats.failures) == (4, 0)  # forward and dW of two layers
    corrupter.armed = True
    loss = model(_batch()).square().mean()  # watched: compared at the end of backward
    with pytest.raises(abft.AbftError) as info:
        loss.backward()
    assert "forward" in info.value.message and stats.failures == 1
    with torch.no_grad(), pytest.raises(abft.AbftError):  # no backward: compared at once
        model(_batch())


@pytest.mark.parametrize("bit", [30, 23, 22])  # top exponent, lowest exponent, top mantissa
def test_a_corrupted_weight_gradient_is_caught(bit):
    model = _mlp()
    armed = [False]

    def corrupt(grad):  # on the weight before the guard's hook: a faulty dW
        return _flip(grad, 1234, bit) if armed[0] else None

    model[0].weight.register_hook(corrupt)
    stats, _ = abft.protect(model)
    _step(model, _batch())
    armed[0] = True
    with pytest.raises(abft.AbftError) as info:
        _step(model, _batch())
    assert "weight-gradient" in info.value.message and stats.failures == 1


@pytest.mark.parametrize("bit", [23, 22])  # the lowest exponent bit, the top mantissa bit
def test_kept_norms_that_are_stale_neither_false_alarm_nor_hide_a_flip(bit):
    model = _mlp()
    corrupter = _Corrupter(model[2], index=None, bit=bit)
    stats, _ = abft.protect(model, norm_every=1000)  # the first call's norms are kept
    x = _batch()
    _step(model, x)
    # the weights grow 10x, then 1000x more (a failing check is decided on fresh
    # norms, which are then kept), then shrink 10x below the kept norms
    for factor in (10.0, 1e3, 0.1):
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(factor)
        _step(model, x)
        assert stats.failures == 0
        corrupter.armed = True
        with pytest.raises(abft.AbftError):
            _step(model, x)
        corrupter.armed = False
        assert stats.failures == 1
        stats.failures = 0


def test_protected_training_loop_keeps_gradients_bitwise_equal():
    plain, checked = _mlp(), _mlp()
    stats, _ = abft.protect(checked, norm_every=3)
    opt_plain = torch.optim.Adam(plain.parameters(), lr=0.05)
    opt_checked = torch.optim.Adam(checked.parameters(), lr=0.05)
    for step in range(8):
        x = _batch(step, scale=10.0 ** (step % 3 - 1))
        for model, opt in ((plain, opt_plain), (checked, opt_checked)):
            _step(model, x)
            opt.step()
        for a, b in zip(plain.parameters(), checked.parameters(), strict=True):
            assert torch.equal(a.grad, b.grad) and torch.equal(a, b)
    assert stats.checks == 8 * 4 and stats.failures == 0


def test_a_layer_called_twice_is_checked_per_call_and_once_for_its_summed_gradient():
    lin = nn.Linear(32, 32)
    stats, _ = abft.protect(lin)
    x = _batch(d_in=32)
    lin(torch.relu(lin(x))).sum().backward()
    assert (stats.checks, stats.failures) == (3, 0)


def test_gradient_accumulation_over_calls_and_over_backwards():
    model = _mlp()
    stats, _ = abft.protect(model)
    model.zero_grad(set_to_none=True)
    (model(_batch(1)).sum() + model(_batch(2)).sum()).backward()  # two forwards, one backward
    model(_batch(3)).sum().backward()  # .grad accumulates: the hook sees this dW only
    assert (stats.checks, stats.failures) == (4 + 2 + 2 + 2, 0)


@pytest.mark.parametrize("shape", [(300, 64), (4, 50, 64), (64,)])
def test_long_flattened_and_single_row_batches(shape):
    model = _mlp()
    corrupter = _Corrupter(model[0], index=3)
    stats, _ = abft.protect(model)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(5)) * 3.0
    model(x).square().mean().backward()
    assert (stats.checks, stats.failures) == (4, 0)
    corrupter.armed = True
    with pytest.raises(abft.AbftError):
        model(x).square().mean().backward()


def test_backward_to_the_inputs_only_checks_the_forward():
    model = _mlp()
    stats, _ = abft.protect(model)
    x = _batch().requires_grad_()
    (grad,) = torch.autograd.grad(model(x).sum(), x)
    assert grad.shape == x.shape
    assert (stats.checks, stats.failures) == (2, 0)  # no weight gradient was computed


def test_a_forward_no_backward_reached_is_compared_at_the_next_call():
    model = _mlp()
    corrupter = _Corrupter(model[0])
    stats, _ = abft.protect(model)
    corrupter.armed = True
    model(_batch())  # grad enabled, but never backpropagated
    corrupter.armed = False
    with pytest.raises(abft.AbftError):
        model(_batch())
    assert stats.failures == 1


def test_removing_the_handles_removes_every_hook():
    model = _mlp()
    stats, handles = abft.protect(model)
    _step(model, _batch())
    for h in handles:
        h.remove()
    assert not model[0].weight._backward_hooks and not model[0]._forward_hooks
    _step(model, _batch())
    assert stats.checks == 4


def test_compute_step_raises_and_the_recomputed_step_is_clean():
    """What the trainer does: an AbftError out of compute_step, then a recomputation."""
    from stalwart import models

    spec = models.default_spec("mlp", model_args={"inputs": "64", "hidden": "128"}, batch_size=16)
    task = models.resolve(spec)
    plain, checked = task.build_model(spec.seed), task.build_model(spec.seed)
    hidden = [m for m in checked.modules() if isinstance(m, nn.Linear)][1]
    corrupter = _Corrupter(hidden, index=None, bit=22)
    stats, _ = abft.protect(checked)
    corrupter.armed = True
    with pytest.raises(abft.AbftError):
        training.compute_step(task, checked, 0, 3, spec)
    corrupter.armed = False
    want = training.compute_gradients(task, plain, 0, 3, spec)
    got = training.compute_gradients(task, checked, 0, 3, spec)
    assert all(torch.equal(want[name], got[name]) for name in want)
    assert stats.failures == 1


@pytest.mark.parametrize("seed", range(3))
def test_inputs_with_a_large_common_component_do_not_false_alarm(seed):
    """Shifted inputs, weights with a common row and same-sign gradients make the
    checksum sums add up coherently, and so their rounding: the tolerance follows."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(512, 1024, generator=g) + 3.0
    w = (torch.randn(1024, 1024, generator=g) + 0.5) / 32
    b = torch.randn(1024, generator=g)
    abft.check_forward(x, w, b, nn.functional.linear(x, w, b))
    grad = torch.rand(512, 1024, generator=g) + 0.5
    abft.check_weight_grad(x, grad, grad.t() @ x)
    abft.check_weight_grad(x.clamp(min=0), grad, grad.t() @ x.clamp(min=0))
