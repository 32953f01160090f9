"""One job's parameters, optimizer and counters on one replica.

Plain torch, no grpc: primaries and backups run the very same ``apply`` on the
very same inputs, which is what keeps replicas bitwise identical. Not
thread-safe: the servicer serialises calls per job.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import google_crc32c
import numpy as np
import torch

from services.paramserver import optim
from services.paramserver.consistency import Mode, Rules, Verdict, judge_push
from stalwart import codec, gradients
from stalwart.api import common, paramserver
from stalwart.errors import ErrorKind, StalwartError
from stalwart.jobspec import GRADIENT_DTYPES

DEDUPE_WINDOW = 65536  # applied (step, slot) keys remembered for conflict checks
# A backup holds a forwarded push only this many steps past what its slot expects
# here: a primary accepts only the expected step, and acknowledges a commit only
# once every in-sync backup answered it, so a backup lags its primary by one
# commit at most. The rest (a push the primary then refuses as ahead) is not kept.
FORWARD_AHEAD = 2

_MODES = {
    common.CONSISTENCY_MODE_SYNC: Mode.SYNC,
    common.CONSISTENCY_MODE_ASYNC: Mode.ASYNC,
    common.CONSISTENCY_MODE_SSP: Mode.SSP,
}


@dataclass(frozen=True)
class Entry:
    """One push inside a commit: its key and the CRC of its bytes."""

    step: int
    slot: int
    crc: int

    def to_proto(self) -> common.CommitEntry:
        return common.CommitEntry(step=self.step, slot=self.slot, payload_crc32c=self.crc)

    @classmethod
    def from_proto(cls, e: common.CommitEntry) -> Entry:
        return cls(e.step, e.slot, e.payload_crc32c)


def rules_from(header: paramserver.ModelHeader) -> Rules:
    c = header.consistency
    mode = _MODES.get(c.mode)
    if mode is None:
        raise StalwartError(
            ErrorKind.INVALID_ARGUMENT, "consistency mode must be SYNC, ASYNC or SSP"
        )
    if header.num_slots < 1:
        raise StalwartError(
            ErrorKind.INVALID_ARGUMENT, f"num_slots must be >= 1, got {header.num_slots}"
        )
    if mode is Mode.SSP and c.staleness < 0:
        raise StalwartError(ErrorKind.INVALID_ARGUMENT, "ssp staleness must be >= 0")
    return Rules(
        mode=mode,
        num_slots=header.num_slots,
        staleness=c.staleness,
        refuse_when_stale=c.policy == common.STALENESS_POLICY_REFUSE,
    )


@dataclass(frozen=True)
class Reduced:
    """One update before the optimizer: the gradients of its pushes summed in slot
    order, and each buffer's combined value (stalwart.gradients.combine_buffers)."""

    grads: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]

    def tensors(self) -> dict[str, torch.Tensor]:
        return {**self.grads, **self.buffers}

    @classmethod
    def split(cls, tensors: Mapping[str, torch.Tensor], buffer_names: frozenset[str]) -> Reduced:
        grads = {n: t for n, t in tensors.items() if n not in buffer_names}
        return cls(grads, {n: t for n, t in tensors.items() if n in buffer_names})


class JobModel:
    """Parameters + optimizer + version/clocks/dedupe/pending of one job."""

    def __init__(self, header: paramserver.ModelHeader, tensors: Mapping[str, torch.Tensor]):
        self.header = header
        self.rules = rules_from(header)
        self.specs = {s.name: s for s in header.tensors}
        self.params = {name: tensors[name].detach().clone() for name in self.specs}
        self.dtypes = {name: p.dtype for name, p in self.params.items()}
        # buffers live beside the parameters (pulled, replicated and checkpointed
        # alike) but the optimizer never sees them
        self.buffers = frozenset(header.buffer_names)
        unknown = self.buffers - set(self.params)
        if unknown:
            raise StalwartError(
                ErrorKind.INVALID_ARGUMENT, f"buffer_names not among the tensors: {sorted(unknown)}"
            )
        self.wire_dtypes = _wire_dtypes(header, self.buffers)
        stepped = [p for n, p in self.params.items() if n not in self.buffers]
        self.optimizer = optim.build(header.optimizer, stepped)
        self._names = {id(p): n for n, p in self.params.items()}
        self.version = 0
        self.clocks = [0] * self.rules.num_slots
        self.applied: OrderedDict[tuple[int, int], int] = OrderedDict()
        self.pending: dict[tuple[int, int], tuple[int, dict[str, torch.Tensor]]] = {}
        self.param_versions = {name: 0 for name in self.params}
        # (version, pushes, update): the reduced update staged for the next commit
        self.summed: tuple[int, tuple[tuple[int, int], ...], Reduced] | None = None

    @property
    def job_id(self) -> str:
        return self.header.job_id

    # --- admission -------------------------------------------------------------

    def check_grad_specs(self, specs: Iterable[common.TensorSpec]) -> None:
        for spec in specs:
            own = self.specs.get(spec.name)
            if own is None:
                raise StalwartError(
                    ErrorKind.BAD_SHAPE, f"job {self.job_id} has no parameter {spec.name!r}"
                )
            if list(spec.shape) != list(own.shape):
                raise StalwartError(
                    ErrorKind.BAD_SHAPE,
                    f"gradient {spec.name} has shape {list(spec.shape)}, parameter has {list(own.shape)}",
                )
            expected = self.wire_dtypes[spec.name]
            if spec.dtype != expected:
                raise StalwartError(
                    ErrorKind.BAD_DTYPE,
                    f"gradient {spec.name} is {common.Dtype.Name(spec.dtype)}, the job expects "
                    f"{common.Dtype.Name(expected)} (parameter "
                    f"{common.Dtype.Name(own.dtype)}, gradient_dtype "
                    f"{common.Dtype.Name(self.header.gradient_dtype)})",
                )

    def check_slot(self, step: int, slot: int) -> None:
        if not 0 <= slot < self.rules.num_slots:
            raise StalwartError(
                ErrorKind.INVALID_ARGUMENT, f"slot {slot} outside [0, {self.rules.num_slots})"
            )
        if step < 0:
            raise StalwartError(ErrorKind.INVALID_ARGUMENT, f"step {step} is negative")

    def judge(self, step: int, slot: int, base_version: int, crc: int) -> Verdict:
        return judge_push(
            self.rules,
            self.version,
            self.clocks,
            step,
            slot,
            base_version,
            crc,
            self.applied.get((step, slot)),
        )

    # --- buffering and applying ------------------------------------------------

    def stage(self, step: int, slot: int, crc: int, grads: dict[str, torch.Tensor]) -> None:
        """Buffer one push, each gradient widened to its parameter's dtype (a float32
        parameter's gradient may travel as bfloat16: JobSpec.gradient_dtype)."""
        self.pending[(step, slot)] = (crc, gradients.widened(grads, self.dtypes))

    def may_hold_forward(self, step: int, slot: int) -> bool:
        """Whether a backup keeps a push its primary forwarded: one a commit could name.

        The primary forwards a push while it streams in, before judging it, so a
        client's pushes of steps ahead or behind (refused there as AHEAD or answered
        as duplicates) reach the backup too. Kept, each stayed buffered until its
        step went by, without bound: a model's worth per push."""
        if not 0 <= slot < self.rules.num_slots:
            return False
        expected = self.version if self.rules.mode is Mode.SYNC else self.clocks[slot]
        return expected <= step <= expected + FORWARD_AHEAD

    def ready_entries(self, step: int, slot: int) -> list[Entry] | None:
        """The entries to commit now, in slot order, or None if the step is incomplete."""
        if self.rules.mode is not Mode.SYNC:
            return [Entry(step, slot, self.pending[(step, slot)][0])]
        keys = [(step, s) for s in range(self.rules.num_slots)]
        if not all(k in self.pending for k in keys):
            return None
        return [Entry(step, s, self.pending[(step, s)][0]) for s in range(self.rules.num_slots)]

    def pushed_slots(self) -> list[int]:
        """Synchronous jobs: the slots whose push for the step at this version arrived."""
        if self.rules.mode is not Mode.SYNC:
            return []
        return sorted(slot for step, slot in self.pending if step == self.version)

    @property
    def forwards_sums(self) -> bool:
        """Does the primary forward this job's updates summed (one transfer per step
        to each backup) instead of each push as it arrives? Where a step sums
        several pushes: synchronous jobs of more than one slot."""
        return self.rules.mode is Mode.SYNC and self.rules.num_slots > 1

    def has_entries(self, entries: Sequence[Entry]) -> bool:
        if self._summed_for(entries) is not None:
            return True
        return all(self.pending.get((e.step, e.slot), (None,))[0] == e.crc for e in entries)

    def reduce(self, entries: Sequence[Entry]) -> Reduced:
        """The entries' gradients summed in the given order and each buffer's combined
        value: what :meth:`apply` feeds the optimizer. The buffered pushes are left
        as they are (the sum goes into a copy when there are several)."""
        summed: dict[str, torch.Tensor] = {}
        buffers: dict[str, list[torch.Tensor]] = {}
        for e in entries:
            for name, grad in self.pending[(e.step, e.slot)][1].items():
                if name in self.buffers:
                    buffers.setdefault(name, []).append(grad)
                elif name in summed:
                    summed[name] += grad
                else:  # one entry: its buffered gradient is ours alone, no copy
                    summed[name] = grad.clone() if len(entries) > 1 else grad
        combined = {name: gradients.combine_buffers(values) for name, values in buffers.items()}
        return Reduced(summed, combined)

    def stage_sum(self, version: int, keys: Sequence[tuple[int, int]], reduced: Reduced) -> None:
        """Hold the reduced update of the pushes ``keys`` (in order), for the commit of
        ``version`` that names them (on a backup: the sum its primary forwarded)."""
        self.summed = (version, tuple(keys), reduced)

    def _summed_for(self, entries: Sequence[Entry]) -> Reduced | None:
        if self.summed is None:
            return None
        version, keys, reduced = self.summed
        if version != self.version or keys != tuple((e.step, e.slot) for e in entries):
            return None
        return reduced

    def apply(self, entries: Sequence[Entry]) -> int:
        """Apply the entries' sum (the reduced update staged for them, or
        :meth:`reduce` of their pushes): clip it, set the version's scheduled rate
        (stalwart.gradients), run the optimizer, set the buffers, bump the version."""
        reduced = self._summed_for(entries) or self.reduce(entries)
        self.summed = None
        for name, param in self.params.items():
            param.grad = reduced.grads.get(name)  # None: the optimizer leaves it alone
        gradients.prepare_step(
            self.optimizer, self.params, reduced.grads, len(entries), self.version,
            self.header.optimizer,
        )  # fmt: skip
        self.optimizer.step()
        for param in self.params.values():
            param.grad = None
        for name, value in reduced.buffers.items():
            self.params[name].copy_(value)
        self.version += 1
        for name in [*reduced.grads, *reduced.buffers]:
            self.param_versions[name] = self.version
        self._record(entries)
        return self.version

    def _record(self, entries: Sequence[Entry]) -> None:
        for e in entries:
            self.clocks[e.slot] = max(self.clocks[e.slot], e.step + 1)
            self.applied[(e.step, e.slot)] = e.crc
            self.pending.pop((e.step, e.slot), None)
        while len(self.applied) > DEDUPE_WINDOW:
            self.applied.popitem(last=False)
        # buffered pushes for steps every slot has passed can never commit
        low = min(self.clocks)
        for key in [k for k in self.pending if k[0] < low]:
            del self.pending[key]

    # --- state transfer and fingerprints ---------------------------------------

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Parameters, then optimizer state as ``<param>/<key>``."""
        out = dict(self.params)
        out.update(optim.export_state(self.optimizer, self._names))
        return out

    def install_header(self, epoch: int, fresh: bool = False) -> paramserver.InstallStateHeader:
        tensors = self.state_tensors()
        return paramserver.InstallStateHeader(
            epoch=epoch,
            fresh=fresh,
            model=self.header,
            version=self.version,
            tensors=[codec.spec_of(n, t) for n, t in tensors.items()],
            applied=[Entry(s, k, c).to_proto() for (s, k), c in self.applied.items()],
            slot_clocks=self.clocks,
        )

    @classmethod
    def from_install(
        cls, header: paramserver.InstallStateHeader, tensors: Mapping[str, torch.Tensor]
    ) -> JobModel:
        job = cls(header.model, tensors)
        state = {k: v for k, v in tensors.items() if k not in job.params}
        optim.import_state(job.optimizer, job.params, state)
        job.version = header.version
        job.clocks = list(header.slot_clocks) or [0] * job.rules.num_slots
        for e in header.applied:
            job.applied[(e.step, e.slot)] = e.payload_crc32c
        job.param_versions = {name: header.version for name in job.params}
        return job

    def fingerprints(self) -> list[paramserver.TensorFingerprint]:
        out = []
        for name, tensor in sorted(self.state_tensors().items()):
            kind = "param" if name in self.params else name.rpartition("/")[2]
            out.append(
                paramserver.TensorFingerprint(
                    name=name, kind=kind, crc32c=codec.tensor_crc32c(tensor)
                )
            )
        return out

    def state_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.state_tensors().values())

    def changed_since(self, version: int) -> list[str]:
        return [n for n, v in self.param_versions.items() if v > version]


def combined_fingerprint(prints: Iterable[paramserver.TensorFingerprint]) -> int:
    crc = 0
    for p in prints:
        crc = google_crc32c.extend(crc, f"{p.name}:{p.kind}:{p.crc32c};".encode())
    return crc


def _wire_dtypes(header: paramserver.ModelHeader, buffers: frozenset[str]) -> dict[str, int]:
    """The dtype each tensor's pushes must carry: buffers' values in their own, parameters'
    gradients as ``header.gradient_dtype`` says (stalwart.gradients.wire_dtype)."""
    if header.gradient_dtype not in GRADIENT_DTYPES:  # the values a JobSpec may hold
        names = " or ".join(common.Dtype.Name(d) for d in GRADIENT_DTYPES)
        raise StalwartError(
            ErrorKind.INVALID_ARGUMENT,
            f"gradient_dtype must be {names}, got {header.gradient_dtype}",
        )
    out = {}
    for spec in header.tensors:
        if spec.name in buffers or spec.dtype not in codec.DTYPES:
            out[spec.name] = spec.dtype
        else:
            param = codec.DTYPES[spec.dtype]
            out[spec.name] = codec.to_wire_dtype(gradients.wire_dtype(param, header.gradient_dtype))
    return out


def check_finite(grads: Mapping[str, torch.Tensor]) -> None:
    for name, grad in grads.items():
        if grad.is_floating_point() and not _all_finite(grad):
            raise StalwartError(ErrorKind.NON_FINITE, f"gradient {name} holds NaN or Inf")


def _all_finite(t: torch.Tensor) -> bool:
    # One summing pass: NaN and Inf propagate through a sum, so a finite sum
    # proves every element finite. A non-finite sum may be mere overflow of
    # huge finite values, so only then pay for the exact element-wise check.
    if t.dtype in (torch.float32, torch.float64, torch.float16):
        wide = np.float32 if t.dtype == torch.float16 else None  # fp16 sums overflow early
        total = np.add.reduce(t.reshape(-1).numpy(), dtype=wide)
    else:
        total = float(t.sum(dtype=torch.float64))
    return bool(np.isfinite(total)) or bool(torch.isfinite(t).all())
