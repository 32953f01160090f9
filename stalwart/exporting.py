"""Getting a job's model out: its weights (and optimizer state) live or from a checkpoint.

Two sources, one result (:class:`Exported`):

- **live**: pulled from the job's paramservers at one version all shard groups
  agree on (the latest, at least ``min_version``), optionally with the
  optimizer state from the same version (``PullRequest.optimizer_state``);
- **a checkpoint**: read from the checkpoint store, every chunk's CRC32C and
  hash checked, so a job that has moved on (or was deleted from the
  paramservers) can still be exported at the step the checkpoint holds.

Weights are named as the model names them (``model.load_state_dict`` takes
them); optimizer state as ``<param>/<key>`` (``fc.weight/exp_avg``,
``fc.weight/step``), the names the paramserver, its replicas and checkpoints use.
:func:`load_optimizer_state` puts such a file into a torch optimizer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from google.protobuf import json_format

from stalwart import checkpoint as ckpt
from stalwart import optim, shardmap, training, weights
from stalwart.api import common, coordinator
from stalwart.client.coordinator import FINISHED, CoordinatorClient
from stalwart.errors import ErrorKind, RpcError, StalwartError
from stalwart.models import resolve

# The optimizer file says what it is in its safetensors metadata.
OPTIMIZER_FORMAT = "stalwart.optimizer-state.v1"


@dataclass
class Exported:
    job_id: str
    version: int
    source: str  # "live" or the checkpoint id
    weights: dict[str, torch.Tensor]  # parameters and buffers, under the model's names
    optimizer_spec: common.OptimizerSpec
    optimizer: dict[str, torch.Tensor] = field(default_factory=dict)  # "<param>/<key>"


async def pull_live(
    client: CoordinatorClient, job_id: str, min_version: int = 0, optimizer_state: bool = False
) -> Exported:
    """The job's state from its paramservers (see the module's docstring)."""
    from stalwart.demo.watch import param_client, pull_weights

    job = await client.get_job(job_id)
    if job.state in FINISHED and min_version > job.step:
        raise StalwartError(
            ErrorKind.FAILED_PRECONDITION,
            f"job {job_id} has ended at version {job.step}; it will never reach "
            f"--min-version {min_version}",
        )
    ps = await param_client(client, job_id, job.spec)
    try:
        version, tensors = await pull_weights(ps, job_id, min_version, optimizer_state)
        names = {p.tensor_name for p in ps.pieces}
    except RpcError as err:
        if err.kind is ErrorKind.UNKNOWN_JOB and job.state in FINISHED:
            raise StalwartError(
                ErrorKind.UNKNOWN_JOB,
                f"job {job_id} has ended and its paramservers no longer hold its model (they "
                "keep the models of the jobs that ended last, --keep-finished-models); "
                "export one of its checkpoints instead (--checkpoint ID)",
            ) from None
        raise
    finally:
        await ps.close()
    own = {n: t for n, t in tensors.items() if n in names}
    state = {n: t for n, t in tensors.items() if n not in names}
    return Exported(job_id, version, "live", own, job.spec.optimizer, state)


def read_checkpoint(
    manifest: common.CheckpointManifest, spec: coordinator.JobSpec, store_url: str = ""
) -> Exported:
    """The state a checkpoint holds (at its step), read from ``store_url`` (default: the
    manifest's store); DATA_LOSS if any chunk fails its checks."""
    from stalwart.stores import open_store

    num_shards = max([s.shard for s in manifest.shards] + [t.shard for t in manifest.tensors]) + 1
    pieces = shardmap.build_shard_map(
        shardmap.shapes_of(training.initial_params(resolve(spec), spec.seed)), num_shards
    )
    with open_store(store_url or manifest.store_url, existing=True) as store:
        tensors, _ = ckpt.read_tensors(store, list(manifest.tensors))
    per_shard: list[dict[str, torch.Tensor]] = [{} for _ in range(num_shards)]
    for t in manifest.tensors:
        per_shard[t.shard][t.spec.name] = tensors[t.spec.name]
    own = shardmap.join(per_shard, pieces)
    missing = sorted({p.tensor_name for p in pieces} - set(own))
    if missing:
        raise StalwartError(
            ErrorKind.INVALID_ARGUMENT,
            f"checkpoint {manifest.checkpoint_id} does not fit the job's model: no {missing[:3]}",
        )
    state = shardmap.join_state(per_shard, pieces)
    return Exported(manifest.job_id, manifest.step, manifest.checkpoint_id, own,
                    manifest.optimizer, state)  # fmt: skip


async def job_checkpoints(client: CoordinatorClient, job_id: str) -> list:
    """Every complete checkpoint of the job, newest first (all pages)."""
    out, token = [], ""
    while True:
        page = await client.list_checkpoints(job_id, page_token=token)
        out += page.checkpoints
        token = page.next_page_token
        if not token:
            return out


async def at_version(
    client: CoordinatorClient, job_id: str, version: int, optimizer_state: bool, store_url: str = ""
) -> Exported:
    """The state at exactly ``version``: the job's checkpoint at that step if it has one,
    else the live state if the job stands there now; FAILED_PRECONDITION otherwise."""
    job = await client.get_job(job_id)
    saved = await job_checkpoints(client, job_id)
    for manifest in saved:
        if manifest.step == version:
            return read_checkpoint(manifest, job.spec, store_url)
    live = await pull_live(client, job_id, version, optimizer_state)
    if live.version == version:
        return live
    steps = sorted({m.step for m in saved})
    raise StalwartError(
        ErrorKind.FAILED_PRECONDITION,
        f"job {job_id} is at version {live.version}, past {version}, and has no checkpoint "
        f"at step {version} (checkpoints at steps: {steps or 'none'})",
    )


def optimizer_metadata(exported: Exported) -> dict[str, str]:
    return {
        "format": OPTIMIZER_FORMAT,
        "job": exported.job_id,
        "version": str(exported.version),
        "source": exported.source,
        "optimizer": json_format.MessageToJson(exported.optimizer_spec, indent=None),
    }


def save(
    exported: Exported, path: Path, fmt: str = "safetensors", optimizer_path: Path | None = None
) -> int:
    """Write the weights to ``path`` and, when asked, the optimizer state to
    ``optimizer_path`` (same format; safetensors metadata says job, version, optimizer).
    Returns the bytes of tensor data written."""
    size = weights.save(exported.weights, path, fmt)
    if optimizer_path is not None:
        size += weights.save(exported.optimizer, optimizer_path, fmt, optimizer_metadata(exported))
    return size


def load_optimizer_state(
    optimizer: torch.optim.Optimizer, model: torch.nn.Module, path: str | Path
) -> None:
    """Give ``optimizer`` (built over ``model``'s parameters, e.g. by stalwart.optim.build)
    the state of an exported optimizer file; INVALID_ARGUMENT for a name the model lacks."""
    state = weights.load(path)
    optim.import_state(optimizer, dict(model.named_parameters()), state)


def state_of(optimizer: torch.optim.Optimizer, params: Mapping[str, torch.Tensor]) -> dict:
    """A torch optimizer's state under the export's names (for comparing with a file)."""
    return optim.export_state(optimizer, {id(p): n for n, p in params.items()})
