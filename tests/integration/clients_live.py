"""What the Go, TypeScript and Java client tests share: whether their toolchain is
there, a way to run it, a live local cluster, and the Python client's pull of a
job's final weights to compare theirs with, byte for byte.

The cluster has two coordinators (so a client given both meets a standby and
must follow NOT_LEADER), one paramserver group (primary + backup) and one
trainer. The other client writes its pull as JSON: ``{"job_id", "tensors":
[{"name", "dtype", "shape", "data" (base64)}]}``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from stalwart import cluster, codec, shardmap
from stalwart.api import common, coordinator
from stalwart.client.coordinator import CoordinatorClient
from stalwart.client.paramserver import ParamServerClient, ShardGroupClient
from stalwart.procs import start_service
from tests.helpers import PRELOAD


def missing_tools(*tools: str) -> str:
    """The reason to skip a client's tests when one of ``tools`` is not on PATH ("" when
    all are); with STALWART_REQUIRE_BACKENDS=1 a missing tool is an error instead."""
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if not missing:
        return ""
    if os.environ.get("STALWART_REQUIRE_BACKENDS") == "1":
        raise RuntimeError(f"no {'/'.join(missing)} on PATH and STALWART_REQUIRE_BACKENDS=1")
    return f"no {'/'.join(missing)} on PATH"


def run_in(directory: Path, cmd: list[str], timeout: float, **env: str):
    """Run ``cmd`` in a client's directory (PYTHON set to this interpreter); its output
    when it exits 0, else the test fails showing both streams."""
    result = subprocess.run(
        cmd, cwd=directory, env=dict(os.environ, PYTHON=sys.executable, **env),
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    assert result.returncode == 0, f"{' '.join(cmd)} failed:\n{result.stdout}\n{result.stderr}"
    return result


@contextmanager
def live_cluster(run_dir: Path, name: str) -> Iterator[cluster.LocalCluster]:
    where = run_dir / name
    # the coordination store in memory, as the other cluster tests have it (not on disk)
    store = tempfile.mkdtemp(
        prefix="stalwart-clients-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
    )
    config = cluster.ClusterConfig(
        trainers=1, standbys=0, shards=1, backups=1, coordinators=2,
        store_url=f"shm://{store}", run_dir=where, preload_services=PRELOAD,
    )  # fmt: skip
    started = cluster.start(config)
    try:
        asyncio.run(cluster.wait_healthy(started, timeout_s=180))
        yield started
    finally:
        started.stop()
        shutil.rmtree(store, ignore_errors=True)


@contextmanager
def standalone_paramserver(run_dir: Path, name: str) -> Iterator[str]:
    """A lone paramserver primary (no coordinator, no backup): it takes a model for any
    job id, which a raw register/push/pull round trip needs. One started with
    --coordinator refuses jobs its coordinator never admitted."""
    proc = start_service("services.paramserver", ["--role", "primary", "--metrics-port", "-1"],
                         run_dir, name, timeout=180, preload=PRELOAD)  # fmt: skip
    try:
        yield proc.address
    finally:
        proc.terminate(timeout=10)


async def _python_pull(addresses: list[str], job_id: str) -> dict[str, tuple[str, list, bytes]]:
    async with CoordinatorClient(addresses) as client:
        shard_map = await client.get_shard_map(job_id)
    groups = [
        ShardGroupClient([g.primary_address, *g.backup_addresses])
        for g in sorted(shard_map.groups, key=lambda g: g.shard)
    ]
    ps = ParamServerClient(groups)
    ps.pieces = [
        shardmap.Piece(p.tensor_name, p.piece_name, p.shard, p.row_start, p.row_end)
        for p in shard_map.shard_map.pieces
    ]
    try:
        _, tensors = await ps.pull(job_id)
    finally:
        await ps.close()
    return {
        name: (common.Dtype.Name(codec.to_wire_dtype(t.dtype)), list(t.shape),
               bytes(codec.byte_view(t)))
        for name, t in tensors.items()
    }  # fmt: skip


def assert_same_weights(dump_path: Path, addresses: list[str]) -> str:
    """The other client's pull equals the Python client's, bitwise; returns the job id."""
    dump = json.loads(Path(dump_path).read_text())
    job_id = dump["job_id"]
    theirs = {
        t["name"]: (t["dtype"], [int(d) for d in t["shape"]], base64.b64decode(t["data"]))
        for t in dump["tensors"]
    }
    ours = asyncio.run(_python_pull(addresses, job_id))
    assert ours, "the Python client pulled no tensors"
    assert sorted(theirs) == sorted(ours)
    for name, (dtype, shape, data) in ours.items():
        assert theirs[name][:2] == (dtype, shape), name
        assert theirs[name][2] == data, f"{name}: bytes differ from the Python client's pull"
    return job_id


async def _job(addresses: list[str], job_id: str) -> coordinator.Job:
    async with CoordinatorClient(addresses) as client:
        return await client.get_job(job_id)


def finished_job(addresses: list[str], job_id: str) -> coordinator.Job:
    return asyncio.run(_job(addresses, job_id))
