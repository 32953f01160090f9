"""Algorithm-based fault tolerance (ABFT) for linear layers: checksums of matmuls.

For ``y = x W^T + b`` (x: [N, in], W: [out, in]; leading dimensions are
flattened into N) the column sums of ``y`` over the batch must equal
``W (x^T 1) + N b``: one matrix-vector product checks the whole matrix product
(Huang & Abraham's checksum idea). In backward, the column sums of the weight
gradient ``dW = g^T x`` must equal ``x^T (g 1)``. Per layer and step that reads
W once and dW once; everything else is batch-sized.

The checks only *read* the layer's inputs and outputs (forward hook, autograd
hooks), never replace its arithmetic, so gradients stay bitwise identical to an
unchecked run. A sum of float32 products carries rounding, so the comparison has
a tolerance scaled by the magnitudes involved (see RTOL). On the bench's mlp it
is 0.3% of a typical element of y for zero-mean inputs and 2-5% for ReLU
outputs (non-negative inputs make the batch sums, and their rounding, add up
coherently), 0.6% of a typical element of dW (0.03% in the output layer): an
exponent flip or a top mantissa flip (a change of a third or more) is caught in
all but the smallest elements, a wrong tile too; flips of low mantissa bits are
what duplicate computation is for.

When a backward follows (training), the hooks only compute each layer's
checksums while y, W and dW are in cache, and every comparison of the step runs
once, at the end of that backward (an autograd callback): a mismatch raises
AbftError out of ``loss.backward()``, before any gradient is read. Until then a
call keeps x and y's gradient (up to 2^20 elements each; larger ones are reduced
at once). A forward with no backward to follow is compared at once; a watched
forward that no backward reached is compared at the layer's next call.

The forward tolerance needs W's row norms, a third weight-sized pass, so a
layer's guard keeps them (and |b|) and recomputes them every ``norm_every``
forward calls and whenever the weight tensor is replaced. Between refreshes they
can be stale:

- weights that *grew* make the tolerance too tight: a check that fails against
  kept norms is re-run against freshly computed ones before anything is raised,
  so stale norms never raise a false alarm;
- weights that *shrank* by a factor f make the tolerance up to f times looser
  until the next refresh. An optimizer step changes a weight row by a small
  fraction of its norm, so f stays near 1 over a few steps (f = 10 would put the
  forward tolerance at up to half a typical element for ReLU inputs).

``norm_every=1`` gives exact norms on every call at the cost of that third pass.

Cost, and why the 5% goal is not met (``stalwart bench sdc``: mlp 256-1024x3-10,
batch 64, one thread, on the shared two-core development machine): +8% to +15%
step time (median +11% over 6 runs), against +13% to +36% (median +29%) for the
previous checks (row sums of y, column sums of dW, exact norms every call) in
runs alternating with them. The floor is one pass over W (its checksum vector
changes every step) and one over dW per layer: a hook doing nothing but those
two matrix-vector products measured about +3% on its own. The rest is some 20
small batch-sized ops per layer (sums, norms, comparisons); run between the
layers' matmuls, which push their code and data out of the caches, each costs
10-40 us instead of the 2-5 us it takes in a loop. Doing them at the end of the
backward rather than in each hook, and keeping W's norms, halved the overhead;
5% would take fusing each layer's ops into one or two kernels (a compiled
extension), or checking less (sampled steps or layers, no forward check), not
a looser tolerance.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field

import torch
from torch import nn

from stalwart.errors import ErrorKind, StalwartError

# Tolerance relative to a Cauchy-Schwarz scale of each checksum entry:
#   forward, column j of y:  |W_j| (|x|_F + |x^T 1|) + N |b_j|
#   dW, column k:            |x_:k| (|g|_F + |g 1|)
# The first term bounds the matmul's own rounding (random across elements); the
# second the rounding of the checksum sums and products, which adds up
# coherently when the summed values share a sign or a common component (ReLU
# activations, a large mean, same-sign gradients): sums of absolute values would
# bound it too, but |x^T 1| and |g 1| cost nothing extra and follow the
# coherence. On float32 the clean error measured at most 6.2e-7 of that scale
# over widths 10-4096, batches 1-8192 rows, inputs from 1e-3 to 1e3 (random,
# non-negative, with a large common component, spread over six orders of
# magnitude, sparse; softmax-like and same-sign gradients; a dominant bias):
# 1.25e-5 leaves a 20x margin. (The earlier scales without the coherent terms,
# |x_i| |W|_F and |g|_F |x_:k| at 4e-6, raised on clean inputs shifted by 3.)
RTOL = 1.25e-5
ATOL = 1e-12
NORM_EVERY = 8  # forward calls between recomputations of a layer's weight row norms
_F32_ROWS = 128  # longest batch whose x^T (g 1) is accumulated in float32
# Inputs and output gradients up to this size are kept until the end of the
# backward and reduced there; larger ones are reduced at once.
_KEEP_ELEMENTS = 1 << 20


class AbftError(StalwartError):
    """A checksum did not match: the matmul's result is corrupt."""

    def __init__(self, message: str):
        super().__init__(ErrorKind.CHECKSUM_MISMATCH, message)


# -- arithmetic ------------------------------------------------------------------
#
# The hooks run between the layers' matmuls, whose kernels push the checks' code
# and data out of the CPU caches: there each op costs 10-40 us, several times its
# cost in a loop. So the hooks only read what is in cache then (y, W, dW) and
# leave the rest, the same dozen small ops for every layer, to one pass at the
# end of the backward.

_CALLS = itertools.count()


def _flat(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    return t if t.dim() == 2 else t.reshape(-1, t.shape[-1])


def _sqnorm(t: torch.Tensor) -> torch.Tensor:
    flat = t.reshape(-1)
    return torch.dot(flat, flat)


def _scalar(t: torch.Tensor):
    """A float on the CPU; elsewhere the 0-dim tensor itself (no device sync)."""
    return float(t) if t.device.type == "cpu" else t


def _sub_scaled(a: torch.Tensor, b: torch.Tensor, factor) -> torch.Tensor:
    """a - factor * b into a new tensor (factor a float or a 0-dim tensor)."""
    if isinstance(factor, float):
        return torch.sub(a, b, alpha=factor)
    return torch.addcmul(a, b, factor, value=-1)


def _add_scaled(a: torch.Tensor, b: torch.Tensor, factor) -> torch.Tensor:
    """a += factor * b."""
    if isinstance(factor, float):
        return a.add_(b, alpha=factor)
    return a.addcmul_(b, factor)


def _worst(over: torch.Tensor) -> float | None:
    """max(over) when it exceeds ATOL (NaN compares false: a mismatch too), else None."""
    if not over.numel():
        return None
    worst = float(over.max())
    return None if worst <= ATOL else worst


def _state(weight: torch.Tensor, bias: torch.Tensor | None) -> tuple:
    """Which tensors, at which in-place version: equal states, equal values."""
    if bias is None:
        return (id(weight), weight.data_ptr(), weight.shape, weight._version)
    return (id(weight), weight.data_ptr(), weight.shape, weight._version, id(bias),
            bias._version)  # fmt: skip


def _row_norms(weight: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(weight.detach(), dim=1)


def _bias_term(bias: torch.Tensor | None, n: int, rtol: float) -> torch.Tensor | None:
    return None if bias is None else bias.detach().abs().mul_(rtol * n)


class _Forward:
    """One forward call's batch checksum, y^T 1 against N b + W (x^T 1), and what
    its tolerance and the dW check of the call need of x.

    The products over y and W are made in the hook, while they are in cache;
    the norms of x only when a comparison needs them. A call a backward will
    follow keeps x (autograd keeps it until then anyway) for its dW check."""

    __slots__ = (
        "ysum", "want", "x2", "s", "n", "rtol", "xsq", "ssq", "norms", "bias_term", "exact",
        "state", "done", "seq",
    )  # fmt: skip

    def __init__(self, x2, weight, bias, y2, rtol: float, keep_x: bool = False):
        n = x2.shape[0]
        self.state = _state(weight, bias)
        weight = weight.detach()
        s = x2.sum(0)  # x^T 1 [in]; torch's sums are cascaded: little rounding
        if bias is None:
            self.want = torch.mv(weight, s)
        else:
            self.want = torch.addmv(bias.detach(), weight, s, beta=n)  # N b + W s
        self.ysum = y2.sum(0)
        self.x2, self.s = x2, s
        self.n = n
        self.rtol = rtol
        self.xsq = self.ssq = self.norms = self.bias_term = None
        self.exact = True  # norms (and |b|) are of this call's weights
        self.done = False
        self.seq = next(_CALLS)  # a corrupt output corrupts what follows: report the first
        if not keep_x:
            self._norms_of_x()
            self.x2 = None

    def _norms_of_x(self) -> None:
        if self.xsq is None:
            self.xsq, self.ssq = _sqnorm(self.x2), _sqnorm(self.s)
            self.s = None

    def over(self, norms: torch.Tensor, bias_term: torch.Tensor | None) -> torch.Tensor:
        """|residual| - tolerance: no entry may exceed ATOL."""
        self._norms_of_x()
        coef = self.rtol * (_scalar(self.xsq) ** 0.5 + _scalar(self.ssq) ** 0.5)
        over = _sub_scaled(torch.sub(self.ysum, self.want).abs_(), norms, coef)
        if bias_term is not None:
            over.sub_(bias_term)
        return over

    def grad_terms(self, g: torch.Tensor) -> tuple:
        return _grad_terms(self.x2, g, self.rtol)


def _grad_terms(x2: torch.Tensor, g: torch.Tensor, rtol: float) -> tuple:
    """For the column sums of one call's dW = g^T x: their expected value
    x^T (g 1), and their tolerance as |x_:k| and its factor rtol (|g|_F + |g 1|)."""
    g2 = _flat(g)
    u = g2.sum(1)  # g 1: [N]
    if x2.shape[0] <= _F32_ROWS:
        want = torch.mv(x2.t(), u)
    else:  # a float32 product over a long batch can round coherently
        want = torch.mv(x2.t().double(), u.double()).to(x2.dtype)
    col_norms = torch.linalg.vecdot(x2, x2, dim=0).sqrt_()
    coef = rtol * (_scalar(_sqnorm(g2)) ** 0.5 + _scalar(_sqnorm(u)) ** 0.5)
    return want, col_norms, coef


def _grad_over(col_sums: torch.Tensor, terms: list) -> torch.Tensor:
    """|dW^T 1 - sum of x^T (g 1)| - tolerance, over the calls' ``grad_terms``.

    The tolerance scale is |x_:k| (|g|_F + |g 1|), not |x_:k| |g 1|: a softmax's
    output gradient sums to ~0 per row, while the rounding of dW follows |g|."""
    if len(terms) == 1:
        want, col_norms, coef = terms[0]
        return _sub_scaled(torch.sub(col_sums, want).abs_(), col_norms, coef)
    want, tol = None, None
    for w, col_norms, coef in terms:
        want = w if want is None else want.add_(w)
        tol = col_norms * coef if tol is None else _add_scaled(tol, col_norms, coef)
    return torch.sub(col_sums, want).abs_().sub_(tol)


def _forward_message(excess: float) -> str:
    return f"ABFT forward checksum mismatch in a linear layer (excess {excess:.3g})"


def _grad_message(excess: float) -> str:
    return f"ABFT weight-gradient checksum mismatch (excess {excess:.3g})"


def check_forward(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, y: torch.Tensor,
    rtol: float = RTOL,
) -> None:  # fmt: skip
    """Raise AbftError unless y's column sums match W (x^T 1) (+ N b)."""
    with torch.no_grad():
        x2 = _flat(x)
        fwd = _Forward(x2, weight, bias, _flat(y), rtol)
        worst = _worst(fwd.over(_row_norms(weight), _bias_term(bias, x2.shape[0], rtol)))
    if worst is not None:
        raise AbftError(_forward_message(worst))


def check_weight_grad(
    x: torch.Tensor, g: torch.Tensor, dweight: torch.Tensor, rtol: float = RTOL
) -> None:
    """Raise AbftError unless dW's column sums match x^T (g 1)."""
    with torch.no_grad():
        terms = _grad_terms(_flat(x), g, rtol)
        worst = _worst(_grad_over(dweight.detach().sum(0), [terms]))
    if worst is not None:
        raise AbftError(_grad_message(worst))


@dataclass
class AbftStats:
    """Checks made and failed, for metrics and the bench."""

    checks: int = 0
    failures: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, failed: bool) -> None:
        with self.lock:
            self.checks += 1
            self.failures += int(failed)


# -- hooks -----------------------------------------------------------------------


class _Share:
    """One guard's share of one backward: its calls whose y got a gradient, each
    with that gradient (or, when large, its ``grad_terms`` at once), and dW's
    column sums once the weight's gradient arrived."""

    __slots__ = ("calls", "col_sums")

    def __init__(self):
        self.calls: list[tuple[_Forward, torch.Tensor | tuple]] = []
        self.col_sums: torch.Tensor | None = None


_BACKWARDS: dict[int, dict[_LinearGuard, _Share]] = {}  # graph task -> its guards' shares
_BACKWARDS_LOCK = threading.Lock()
_graph_task = torch._C._current_graph_task_id


def _share(guard: _LinearGuard) -> _Share:
    """The running backward's share for ``guard``; the first one queues the final check."""
    task = _graph_task()
    with _BACKWARDS_LOCK:
        shares = _BACKWARDS.get(task)
        if shares is None:
            while len(_BACKWARDS) >= 16:  # left by backwards that failed before their end
                del _BACKWARDS[next(iter(_BACKWARDS))]
            shares = _BACKWARDS[task] = {}
            torch.autograd.Variable._execution_engine.queue_callback(lambda: _finish(task))
        share = shares.get(guard)
        if share is None:
            share = shares[guard] = _Share()
    return share


def _finish(task: int) -> None:
    """End of a backward: every comparison of its guards, one reduction when all hold."""
    with _BACKWARDS_LOCK:
        shares = _BACKWARDS.pop(task, None)
    if not shares:
        return
    checks: list[tuple] = []  # (guard, forward call or None for dW, over)
    with torch.no_grad():
        for guard, share in shares.items():
            for fwd, _ in share.calls:
                if not fwd.done:
                    fwd.done = True
                    checks.append((guard, fwd, fwd.over(fwd.norms, fwd.bias_term)))
            if share.col_sums is not None:
                terms = [g if isinstance(g, tuple) else fwd.grad_terms(g) for fwd, g in share.calls]
                checks.append((guard, None, _grad_over(share.col_sums, terms)))
        if not checks:
            return
        worst = _worst(torch.cat([over for _, _, over in checks]))
        if worst is None:
            for guard, _, _ in checks:
                guard.stats.count(False)
            return
        # find the culprit: forward checks in call order, then the gradients'
        checks.sort(key=lambda c: (c[1] is None, c[1].seq if c[1] is not None else 0))
        for guard, fwd, over in checks:
            if fwd is None:
                failed = _worst(over)
                message = None if failed is None else _grad_message(failed)
            else:
                failed = guard.recheck_forward(fwd, over)
                message = None if failed is None else _forward_message(failed)
            guard.stats.count(failed is not None)
            if failed is not None:
                raise AbftError(message)


class _LinearGuard:
    """Hooks of one nn.Linear: checks forward, and dW when the weight needs a gradient.

    The forward hook makes the call's checksums and, when a backward will follow,
    hooks y's gradient node: that hook lists the call, with its gradient, in the
    running backward's share for this guard. A hook on the weight, registered
    once, takes the column sums of dW (a layer called several times in one graph
    gets one summed dW) before it is accumulated into ``.grad``; what they are
    compared with, and every comparison, is made at the end of the backward.
    """

    def __init__(
        self, module: nn.Linear, stats: AbftStats, backward: bool, norm_every: int = NORM_EVERY
    ):
        self.module = module
        self.stats = stats
        self.backward = backward
        self.norm_every = max(1, norm_every)
        self.rtol = RTOL
        # W's row norms and |b| as of the last refresh (see the module docstring)
        self._norms: torch.Tensor | None = None
        self._bias_abs: torch.Tensor | None = None
        self._bias_term: tuple[int, torch.Tensor] | None = None  # (N, rtol N |b|)
        self._state: tuple = ()
        self._age = 0
        self._hooked: torch.Tensor | None = None  # the weight carrying the dW hook
        self._weight_handle = None
        self._untouched: list[_Forward] = []  # watched calls no backward has reached yet

    # -- magnitudes -------------------------------------------------------------

    def _refresh(self, weight: torch.Tensor, bias: torch.Tensor | None, state: tuple) -> None:
        self._norms = _row_norms(weight)
        self._bias_abs = None if bias is None else bias.detach().abs()
        self._bias_term = None
        self._state = state
        self._age = 0

    def _magnitudes(self, fwd: _Forward, weight, bias) -> None:
        """Row norms of W and rtol N |b|, recomputed every ``norm_every`` calls."""
        state = fwd.state
        kept = self._state
        # same tensors (identity, storage, shape), whatever their versions
        if self._age >= self.norm_every or kept[:3] != state[:3] or kept[4:5] != state[4:5]:
            self._refresh(weight, bias, state)
        self._age += 1
        fwd.exact = self._state == state
        fwd.norms = self._norms
        if self._bias_abs is not None:
            n = fwd.n
            if self._bias_term is None or self._bias_term[0] != n:
                self._bias_term = (n, self._bias_abs * (self.rtol * n))
            fwd.bias_term = self._bias_term[1]

    def recheck_forward(self, fwd: _Forward, over: torch.Tensor) -> float | None:
        """The excess of a forward check; when kept magnitudes make it fail, it is
        decided on fresh ones (weights that grew since the refresh)."""
        worst = _worst(over)
        if worst is None or fwd.exact:
            return worst
        weight, bias = self.module.weight, self.module.bias
        state = _state(weight, bias)
        if state != fwd.state:
            # the weights changed since that call (only a call no backward reached
            # is compared this late): its magnitudes cannot be recomputed
            return None
        self._refresh(weight, bias, state)
        return _worst(fwd.over(self._norms, _bias_term(bias, fwd.n, self.rtol)))

    # -- forward ----------------------------------------------------------------

    def __call__(self, module: nn.Linear, inputs, output: torch.Tensor) -> None:
        weight, bias = module.weight, module.bias
        watch = (
            self.backward
            and output.requires_grad
            and weight.requires_grad
            and output.grad_fn is not None
            and torch.is_grad_enabled()
        )
        fwd = _Forward(_flat(inputs[0]), weight, bias, _flat(output), self.rtol, keep_x=watch)
        self._magnitudes(fwd, weight, bias)
        if self._untouched:  # no backward reached them: compare them now
            stale, self._untouched = self._untouched, []
            for old in stale:
                self._check_now(old)
        if not watch:
            self._check_now(fwd)
            return
        self._untouched.append(fwd)
        if self._hooked is not weight:
            self._hook_weight(weight)

        def on_output_grad(grad_outputs) -> None:
            # y's gradient arrives before the layer's backward computes dW
            g = grad_outputs[0]
            if g is None:
                return
            g = g.detach()
            if g.numel() > _KEEP_ELEMENTS or fwd.x2.numel() > _KEEP_ELEMENTS:
                g = fwd.grad_terms(g)  # reduce now rather than keep them to the end
            _share(self).calls.append((fwd, g))
            if fwd in self._untouched:
                self._untouched.remove(fwd)

        output.grad_fn.register_prehook(on_output_grad)

    def _check_now(self, fwd: _Forward) -> None:
        fwd.done = True
        worst = self.recheck_forward(fwd, fwd.over(fwd.norms, fwd.bias_term))
        self.stats.count(worst is not None)
        if worst is not None:
            raise AbftError(_forward_message(worst))

    # -- backward ---------------------------------------------------------------

    def _hook_weight(self, weight: torch.Tensor) -> None:
        if self._weight_handle is not None:
            self._weight_handle.remove()
        self._hooked = weight
        self._weight_handle = weight.register_hook(self._on_weight_grad)

    def _on_weight_grad(self, dweight: torch.Tensor) -> None:
        with _BACKWARDS_LOCK:
            share = _BACKWARDS.get(_graph_task(), {}).get(self)
        if share is None or share.col_sums is not None or not share.calls:
            return  # no forward of this backward was watched
        # dW is read here, in cache; its expected sums need only batch-sized tensors
        share.col_sums = dweight.detach().sum(0)

    def remove(self) -> None:
        if self._weight_handle is not None:
            self._weight_handle.remove()
        self._weight_handle = self._hooked = None
        self._untouched = []


class _GuardHandle:
    """Removes a guard's forward hook and its weight hook."""

    def __init__(self, guard: _LinearGuard, handle):
        self.guard = guard
        self.handle = handle

    def remove(self) -> None:
        self.handle.remove()
        self.guard.remove()


def protect(
    model: nn.Module, backward: bool = True, norm_every: int = NORM_EVERY
) -> tuple[AbftStats, list]:
    """Check every nn.Linear of ``model``; returns the stats and the hook handles.

    ``handle.remove()`` for each handle turns the checks off again.
    ``norm_every``: forward calls between recomputations of a layer's weight row
    norms (1: every call; see the module docstring).
    """
    stats = AbftStats()
    handles = []
    for m in model.modules():
        if isinstance(m, nn.Linear):
            guard = _LinearGuard(m, stats, backward, norm_every)
            handles.append(_GuardHandle(guard, m.register_forward_hook(guard)))
    return stats, handles
