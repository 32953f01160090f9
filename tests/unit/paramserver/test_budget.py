"""How much a job's model takes on a paramserver, and whether it has room for it."""

from __future__ import annotations

import sys

import pytest

from services.paramserver import budget
from stalwart import meminfo
from stalwart.api import common, paramserver
from stalwart.errors import ErrorKind, StalwartError

MIB = 1 << 20


def header(params_mib: int, kind=common.OPTIMIZER_KIND_ADAM, momentum=0.0, job="j"):
    return paramserver.ModelHeader(
        job_id=job,
        optimizer=common.OptimizerSpec(kind=kind, lr=0.1, momentum=momentum),
        tensors=[
            common.TensorSpec(name="w", dtype=common.DTYPE_FLOAT32, shape=[params_mib, MIB // 4])
        ],  # fmt: skip
    )


@pytest.mark.parametrize(
    ("kind", "momentum", "copies"),
    [(common.OPTIMIZER_KIND_ADAM, 0.0, 5), (common.OPTIMIZER_KIND_ADAMW, 0.0, 5),
     (common.OPTIMIZER_KIND_SGD, 0.9, 4), (common.OPTIMIZER_KIND_SGD, 0.0, 3)],
)  # fmt: skip
def test_the_footprint_counts_optimizer_state_and_step_buffers(kind, momentum, copies):
    assert budget.footprint(header(10, kind, momentum)) == copies * 10 * MIB


def test_the_footprint_counts_a_staged_push_per_slot():
    """A synchronous step stages every slot's push until the last one arrives."""
    many = header(10, common.OPTIMIZER_KIND_SGD)
    many.num_slots = 1000
    assert budget.footprint(many) == (3 + 1000) * 10 * MIB
    with pytest.raises(StalwartError) as refused:
        budget.check_room(many, 1 << 33)  # 8 GiB, where it needs about 9.8
    assert "the pushes of its 1000 slot(s)" in refused.value.message


def test_a_budget_is_shared_by_the_jobs_held():
    held = [header(10), header(4, common.OPTIMIZER_KIND_SGD)]  # 50 + 12 MiB
    assert budget.room(100 * MIB, held) == 38 * MIB
    budget.check_room(header(7), 38 * MIB)  # 35 MiB fits
    with pytest.raises(StalwartError) as refused:
        budget.check_room(header(8, job="big"), 38 * MIB)  # 40 MiB does not
    err = refused.value
    assert err.kind is ErrorKind.LIMIT_EXCEEDED and err.metadata["needed_bytes"] == str(40 * MIB)
    assert "the model of job 'big' needs about 40 MiB here" in err.message
    assert "has 38 MiB of room" in err.message


def _machine(tmp_path, read) -> tuple:
    """Fake /proc and cgroup folders, after checking that ``read`` gives sys.maxsize
    without them (not Linux); /proc/meminfo: 24,000,000 kB in all, 1,000 kB free."""
    proc, cgroup = tmp_path / "proc", tmp_path / "cgroup"
    assert read(proc, cgroup) == sys.maxsize
    proc.mkdir()
    cgroup.mkdir()
    (proc / "meminfo").write_text("MemTotal: 24000000 kB\nMemAvailable: 1000 kB\n")
    return proc, cgroup


def test_without_a_budget_the_room_is_what_is_available(tmp_path):
    proc, cgroup = _machine(tmp_path, meminfo.available_bytes)
    assert meminfo.available_bytes(proc, cgroup) == 1000 * 1024  # no cgroup files
    (cgroup / "memory.max").write_text("max\n")
    (cgroup / "memory.current").write_text("5000\n")
    assert meminfo.available_bytes(proc, cgroup) == 1000 * 1024  # a cgroup without a limit
    (cgroup / "memory.max").write_text("105000\n")
    assert meminfo.available_bytes(proc, cgroup) == 100_000  # the container's limit is less
    (cgroup / "memory.stat").write_text("anon 3000\ninactive_file 2000\nactive_file 0\n")
    assert meminfo.available_bytes(proc, cgroup) == 102_000  # page cache it can drop is room


def test_the_machine_total_is_memtotal_or_a_lower_cgroup_limit(tmp_path):
    proc, cgroup = _machine(tmp_path, meminfo.total_bytes)
    assert meminfo.total_bytes(proc, cgroup) == 24000000 * 1024
    (cgroup / "memory.max").write_text("max\n")
    assert meminfo.total_bytes(proc, cgroup) == 24000000 * 1024
    (cgroup / "memory.max").write_text("8000000000\n")
    assert meminfo.total_bytes(proc, cgroup) == 8_000_000_000


def test_a_local_cluster_gives_each_paramserver_a_quarter_of_the_machine():
    from stalwart import cluster

    assert cluster.paramserver_budget(cluster.ClusterConfig(), total=24 << 30) == 6 << 30
    assert cluster.paramserver_budget(cluster.ClusterConfig(), total=sys.maxsize) == 0
    chosen = cluster.ClusterConfig(paramserver_memory_bytes=0)  # none: what is free
    assert cluster.paramserver_budget(chosen, total=24 << 30) == 0
