"""Whether a new job's model fits in this replica's memory. Pure but for reading it.

A paramserver holds every job of its shard group in memory. A model too large for
it (a typo in ``model_args``, or a hostile request) would otherwise be allocated
until the kernel's OOM killer ended the process, and with it the state of every
other job the replica holds. So RegisterModel reckons, from the header alone and
before a byte of the model is read, what the job will hold, and refuses it
(``LIMIT_EXCEEDED``) when that is more than the replica has room for: its
``--memory-budget-bytes`` less what the jobs it holds take, or, with no budget
set, the memory the machine (or the container's cgroup) has available.
"""

from __future__ import annotations

from collections.abc import Iterable

from stalwart import wiredtypes
from stalwart.api import common, paramserver
from stalwart.errors import ErrorKind, StalwartError
from stalwart.meminfo import available_bytes
from stalwart.settings import MIB

# Besides the parameters and the optimizer's state, a job holds about two more
# copies of its parameters: the sum a synchronous step builds from the slots'
# pushes, and the serialized chunks of the last pull, kept to answer the next.
STEP_COPIES = 2
# And each slot's push of the step, staged (widened to the parameters' dtype) until
# every slot has pushed: one copy per slot. A job of 1,000 slots on a model of 17 MiB
# held 17 GB here before the budget counted them, and the OOM killer ended the replica.


def optimizer_copies(spec: common.OptimizerSpec) -> int:
    """Copies of the parameters the optimizer keeps: Adam's two moments, SGD's momentum."""
    if spec.kind in (common.OPTIMIZER_KIND_ADAM, common.OPTIMIZER_KIND_ADAMW):
        return 2
    return 1 if spec.momentum > 0 else 0


def footprint(header: paramserver.ModelHeader) -> int:
    """Bytes a job with this model header will hold on a replica, about: parameters,
    optimizer state, a step's buffers, and a staged push per slot."""
    params = sum(wiredtypes.tensor_nbytes(t) for t in header.tensors)
    copies = 1 + optimizer_copies(header.optimizer) + STEP_COPIES + max(header.num_slots, 0)
    return params * copies


def check_room(header: paramserver.ModelHeader, room: int) -> None:
    """Refuse a model whose footprint is more than ``room`` bytes."""
    needed = footprint(header)
    if needed > room:
        raise StalwartError(
            ErrorKind.LIMIT_EXCEEDED,
            f"the model of job {header.job_id!r} needs about {needed // MIB:,} MiB here "
            f"(parameters, optimizer state, a step's buffers and the pushes of its "
            f"{header.num_slots} slot(s)), and this paramserver has {max(room, 0) // MIB:,} "
            "MiB of room",
            job=header.job_id,
            needed_bytes=needed,
        )


def room(budget: int, held: Iterable[paramserver.ModelHeader]) -> int:
    """Bytes left for a new job: the budget less the held jobs' footprints, or (budget
    0) the memory available now, which already counts what the held jobs take."""
    if budget:
        return budget - sum(footprint(h) for h in held)
    return available_bytes()
