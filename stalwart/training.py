"""How a slot's gradient is computed, and the plain loop every distributed run must equal.

:func:`compute_gradients` is what trainers run; :func:`reference_run` is a
single-process torch loop doing the same arithmetic in the same order as the
paramserver (each slot's gradient, summed in slot order, reduced, clipped and
given the version's scheduled rate by :func:`stalwart.gradients.prepare_step`,
then ``torch.optim.<Opt>(foreach=False)`` built by :func:`stalwart.optim.build`).
A sync-mode job with the same spec must end bitwise equal to it, whatever
failed on the way (DESIGN.md invariant 4).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from stalwart import gradients, optim, schedule, weights
from stalwart.api import coordinator
from stalwart.models import Task, resolve
from stalwart.models.base import derive_seed, seeded_global_rng


def make_deterministic(threads: int = 1) -> None:
    """Deterministic kernels and a fixed thread count, before any gradient is computed.

    One intra-op thread keeps CPU reductions in one order; cuBLAS needs a fixed
    workspace to be deterministic (it reads the variable when CUDA starts).
    ``warn_only``: an op with no deterministic kernel warns instead of failing the
    job, and the bitwise tests would catch any difference it makes.
    """
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False


@dataclass(frozen=True)
class StepResult:
    """What a slot pushes: ``grads`` holds every parameter's gradient and, under
    their own names, the values the model's buffers reached (``buffers``)."""

    grads: dict[str, torch.Tensor]
    loss: float
    examples: int
    buffers: frozenset[str] = frozenset()

    def grad_norm(self) -> float:
        """The L2 norm of the gradients, in float64 (telemetry: one reduction, not one
        per tensor)."""
        flat = [g.reshape(-1) for n, g in self.grads.items() if n not in self.buffers]
        if not flat:
            return 0.0
        return float(torch.linalg.vector_norm(torch.cat(flat), dtype=torch.float64))


def compute_step(
    task: Task, model: torch.nn.Module, slot: int, step: int, spec: coordinator.JobSpec
) -> StepResult:
    """One slot's push for one step from the model's current weights, on CPU.

    Plain sync SGD (``spec.local_steps`` 0 or 1): the gradient of
    ``spec.micro_batches`` micro-batches (gradient accumulation), each loss
    divided by their count, under :func:`model_rng`. Every parameter gets a
    gradient (zeros where the loss does not reach it), so the paramserver and
    the reference loop step exactly the same tensors.

    Local SGD (``local_steps`` H > 1): H inner SGD steps at ``spec.local_lr``,
    inner step k computed as sync step ``step * H + k`` would be (its batches,
    its RNG); the push is the pseudo-gradient, the weights before minus the
    weights after, which the paramserver's optimizer takes as the outer step.

    Either way the model ends with the weights and buffers it started with, so a
    recomputation (duplicate compute, ABFT retry) starts where this one did.
    """
    before = {n: b.detach().clone() for n, b in model_buffers(model).items()}
    try:
        if local_steps(spec) > 1:
            grads, losses, examples = _local_steps(task, model, slot, step, spec)
        else:
            losses, examples = _accumulate(task, model, slot, step, spec)
            grads = _param_grads(model)
        grads = gradients.narrowed(grads, spec.gradient_dtype)  # as they travel
        # the buffers' new values are pushed
        for name, b in model_buffers(model).items():
            grads[name] = b.detach().to("cpu", copy=True).contiguous()
    finally:
        model.zero_grad(set_to_none=True)
        with torch.no_grad():
            for name, b in model_buffers(model).items():
                b.copy_(before[name])
    return StepResult(grads, sum(losses) / len(losses), examples, frozenset(before))


def local_steps(spec: coordinator.JobSpec) -> int:
    """Inner steps per pushed update: ``spec.local_steps``, 0 meaning 1."""
    return max(spec.local_steps, 1)


def one_inner_step(spec: coordinator.JobSpec) -> coordinator.JobSpec:
    """A copy of ``spec`` as a plain sync job: a warm-up step that costs one step, not H."""
    out = coordinator.JobSpec()
    out.CopyFrom(spec)
    out.local_steps, out.local_lr = 0, 0.0
    return out


def _accumulate(
    task: Task, model: torch.nn.Module, slot: int, step: int, spec: coordinator.JobSpec
) -> tuple[list[float], int]:
    """Backward over sync step ``step``'s micro-batches into the parameters' ``.grad``.

    Returns the micro-batches' losses and the examples seen; ``.grad`` is
    cleared first.
    """
    device = next(model.parameters()).device
    micro = max(spec.micro_batches, 1)
    model.zero_grad(set_to_none=True)
    losses, examples = [], 0
    with model_rng(spec.seed, slot, step, device):
        for m in range(micro):
            x, y = task.batch(spec.seed, slot, step * micro + m, spec.batch_size)
            loss = task.loss(model, x.to(device), y.to(device))
            # the mean over micro-batches; one micro-batch keeps the plain graph
            (loss / micro if micro > 1 else loss).backward()
            losses.append(float(loss.detach()))
            examples += len(y)
    return losses, examples


def _param_grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's ``.grad`` as a contiguous CPU copy, zeros where there is none."""
    grads = {}
    for name, p in model.named_parameters():
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        grads[name] = g.detach().to("cpu", copy=True).contiguous()
    return grads


def _local_steps(
    task: Task, model: torch.nn.Module, slot: int, step: int, spec: coordinator.JobSpec
) -> tuple[dict[str, torch.Tensor], list[float], int]:
    """H inner SGD steps; the pseudo-gradient theta_0 - theta_H, the losses, the examples.

    The inner update is ``p.add_(grad, alpha=-local_lr)``, torch.optim.SGD's
    own (foreach=False, no momentum): deterministic, and what a hand-written
    loop computes. The parameters get theta_0 back, even when an inner step
    raises (an ABFT mismatch is retried from the same weights).
    """
    h, lr = local_steps(spec), spec.local_lr
    params = dict(model.named_parameters())
    theta0 = {n: p.detach().clone() for n, p in params.items()}
    losses, examples = [], 0
    try:
        for k in range(h):
            inner_losses, inner_examples = _accumulate(task, model, slot, step * h + k, spec)
            # an inner step's loss is the mean over its micro-batches, as a sync step's
            losses.append(sum(inner_losses) / len(inner_losses))
            examples += inner_examples
            with torch.no_grad():
                for p in params.values():
                    if p.grad is not None:
                        p.add_(p.grad, alpha=-lr)
        with torch.no_grad():
            pseudo = {n: (theta0[n] - p).to("cpu").contiguous() for n, p in params.items()}
    finally:
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(theta0[n])
    return pseudo, losses, examples


def model_buffers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The buffers that travel with a job: those in the state dict (persistent ones)."""
    saved = model.state_dict(keep_vars=True)
    return {n: b for n, b in model.named_buffers() if n in saved}


@contextlib.contextmanager
def model_rng(seed: int, slot: int, step: int, device: torch.device):
    """The global RNG (CPU, and the model's GPU) forked and seeded from (seed, slot, step).

    Dropout and any other draw inside ``loss()`` take numbers from the global
    generator; seeding it per (seed, slot, step) makes them the same on whichever
    trainer computes the slot, and the fork leaves the caller's RNG untouched.
    """
    devices = []
    if device.type == "cuda":
        devices = [torch.cuda.current_device() if device.index is None else device.index]
    with seeded_global_rng(derive_seed(seed, "model-rng", slot, step), devices):
        yield


def compute_gradients(
    task: Task, model: torch.nn.Module, slot: int, step: int, spec: coordinator.JobSpec
) -> dict[str, torch.Tensor]:
    """``{parameter name: gradient}`` of slot ``slot`` at step ``step`` (CPU tensors)."""
    return compute_step(task, model, slot, step, spec).grads


def sum_in_slot_order(per_slot: list[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """g0.clone(); g0 += g1; ... — the paramserver's order, so the rounding is the same."""
    total = {name: g.clone() for name, g in per_slot[0].items()}
    for grads in per_slot[1:]:
        for name, g in grads.items():
            total[name] += g
    return total


def initial_params(task: Task, seed: int) -> dict[str, torch.Tensor]:
    """The seeded initial weights as registered on the paramservers: parameters, then buffers."""
    model = task.build_model(seed)
    out = {n: p.detach().clone() for n, p in model.named_parameters()}
    out.update((n, b.detach().clone()) for n, b in model_buffers(model).items())
    return out


def initial_state(task: Task, spec: coordinator.JobSpec) -> dict[str, torch.Tensor]:
    """What a job starts from: :func:`initial_params`, or the file ``spec.init_from`` names."""
    initial = initial_params(task, spec.seed)
    return weights.overlay(initial, spec.init_from) if spec.init_from else initial


def buffer_names(task: Task, seed: int) -> list[str]:
    """Names of the model's buffers among :func:`initial_params` (ModelHeader.buffer_names)."""
    return list(model_buffers(task.build_model(seed)))


def load_params(model: torch.nn.Module, params: Mapping[str, torch.Tensor]) -> None:
    """Copy ``params`` (parameters and buffers) into the model in place (bitwise, any device)."""
    own = dict(model.named_parameters())
    own.update(model_buffers(model))
    with torch.no_grad():
        for name, value in params.items():
            own[name].copy_(value)


def reference_run(
    spec: coordinator.JobSpec, steps: int | None = None, device: str = "cpu"
) -> dict[str, torch.Tensor]:
    """Train ``steps`` (default ``spec.steps``) sync steps in one process; CPU weights."""
    task = resolve(spec)
    model = task.build_model(spec.seed).to(device)
    # The optimizer owns separate CPU tensors, as the paramserver does; the model
    # only ever sees copies of them.
    state = initial_state(task, spec)
    buffers = set(model_buffers(model))
    params = {n: t for n, t in state.items() if n not in buffers}
    rule = schedule.resolved(spec.optimizer, spec.steps)
    optimizer = optim.build(rule, list(params.values()))
    for step in range(spec.steps if steps is None else steps):
        load_params(model, state)
        per_slot = [compute_gradients(task, model, k, step, spec) for k in range(spec.num_slots)]
        # widened back to the parameters' dtypes, as the paramserver stages them
        dtypes = {n: p.dtype for n, p in params.items()}
        summed = sum_in_slot_order([gradients.widened({n: g[n] for n in params}, dtypes)
                                    for g in per_slot])  # fmt: skip
        for name, p in params.items():
            p.grad = summed[name]
        gradients.prepare_step(optimizer, params, summed, len(per_slot), step, rule)
        optimizer.step()
        for p in params.values():
            p.grad = None
        for name in buffers:  # as the paramserver combines them (ModelHeader.buffer_names)
            state[name].copy_(gradients.combine_buffers([g[name] for g in per_slot]))
    return state


def evaluate(spec: coordinator.JobSpec, params: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """Held-out metrics of the task's model carrying ``params``."""
    task = resolve(spec)
    model = task.build_model(spec.seed)
    load_params(model, params)
    return task.evaluate(model)
