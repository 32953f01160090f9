"""The Grafana dashboard reads only series the services export: start a real local
cluster (a coordinator on an shm:// store, a paramserver primary and backup registered
with it, one trainer), run a tiny job to the end, scrape each process's /metrics and
find every name deploy/grafana/metrics.txt says that process exports, with its type
(histograms as _bucket/_sum/_count). A few values are checked too, so a series that
exists but is never updated does not pass."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from stalwart.api import common, coordinator
from stalwart.client import CoordinatorClient
from stalwart.healthcheck import probe
from stalwart.procs import ServiceProcess
from tests.backends import shm_url  # noqa: F401
from tests.helpers import assert_eventually
from tests.integration.coordinator.support import job_spec, wait_leader
from tests.launcher import Launcher

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[2]
METRICS_TXT = ROOT / "deploy" / "grafana" / "metrics.txt"

# Series another part of the project still has to add (owner in the comment). They
# are skipped here, not required to be absent: whoever adds one removes it from here.
NOT_YET: set[str] = {}


def expected() -> dict[str, list[tuple[str, str]]]:
    """service -> [(name, type)] from metrics.txt ("all" means every service)."""
    out: dict[str, list[tuple[str, str]]] = {}
    for line in METRICS_TXT.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, kind, exporters = line.split()[:3]
        for service in exporters.split(","):
            targets = ("trainer", "paramserver", "coordinator") if service == "all" else (service,)
            for target in targets:
                out.setdefault(target, []).append((name, kind))
    return out


def scrape(proc: ServiceProcess) -> dict[str, list]:
    """sample name -> [(labels, value)], and the declared type of each family."""
    port = proc.metrics_port
    assert port, f"{proc.name} serves no /metrics (ready file: {proc.ready})"
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))
            samples.setdefault(f"TYPE {family.name}", [family.type])
    return samples


def missing(samples: dict[str, list], name: str, kind: str) -> list[str]:
    if kind == "histogram":
        wanted = [f"{name}_bucket", f"{name}_sum", f"{name}_count"]
    else:
        wanted = [name]
    gone = [w for w in wanted if w not in samples]
    family = name.removesuffix("_total") if kind == "counter" else name
    declared = samples.get(f"TYPE {family}", [None])[0]
    if not gone and declared != kind:
        gone.append(f"{name} (declared {declared}, want {kind})")
    return gone


def value(samples: dict[str, list], name: str, **labels: str) -> float:
    return sum(v for got, v in samples.get(name, []) if labels.items() <= got.items())


@pytest.fixture
def launcher(run_dir: Path) -> Iterator[Launcher]:
    # no --metrics-port: the default 0 picks a free port and writes it to the ready file
    launch = Launcher(run_dir / "dashboard", flags=("--grace-seconds", "2"), timeout=90)
    try:
        yield launch
    finally:
        launch.stop_all()


def test_every_dashboard_series_is_exported_by_its_service(launcher, shm_url):  # noqa: F811
    coord = launcher.launch("services.coordinator", "c1", "--node-id", "c1",
                            "--store-url", shm_url, "--store-prefix", launcher.prefix)  # fmt: skip
    asyncio.run(wait_leader(coord.address))
    join = ("--coordinator", coord.address)
    backup = launcher.launch("services.paramserver", "ps-b", "--node-id", "ps-b",
                             "--role", "backup", *join)  # fmt: skip
    primary = launcher.launch("services.paramserver", "ps-p", "--node-id", "ps-p",
                              "--role", "primary", "--backups", backup.address, *join)  # fmt: skip
    trainer = launcher.launch("services.trainer", "tr0", "--node-id", "tr0", *join)
    steps = 8
    job = asyncio.run(run_job(coord.address, steps))
    assert job.state == coordinator.JOB_STATE_SUCCEEDED, job.reason

    procs = {"coordinator": [coord], "paramserver": [primary, backup], "trainer": [trainer],
             "paramserver-primary": [primary]}  # fmt: skip
    for proc in (coord, primary, backup, trainer):
        probe(proc.address)  # one RPC each, so the gRPC server series have a sample
    problems = []
    for service, names in expected().items():
        for proc in procs.get(service, []):
            samples = scrape(proc)
            for name, kind in names:
                if name not in NOT_YET:
                    problems += [f"{proc.name}: {m}" for m in missing(samples, name, kind)]
    assert not problems, "series the dashboard reads but the service does not export:\n" + (
        "\n".join(problems)
    )

    # the series move with the work
    t = scrape(trainer)
    assert value(t, "stalwart_trainer_steps_total") == steps
    assert value(t, "stalwart_trainer_samples_total") == steps * 8  # batch_size 8, one slot
    assert value(t, "stalwart_trainer_step_seconds_count") == steps
    p, b = scrape(primary), scrape(backup)
    assert value(p, "stalwart_paramserver_version") == steps
    assert value(p, "stalwart_paramserver_is_primary") == 1
    assert value(b, "stalwart_paramserver_is_primary") == 0
    assert value(b, "stalwart_paramserver_version") == steps  # replicated
    assert value(p, "stalwart_paramserver_pushes_total", result="applied") >= steps
    assert value(p, "stalwart_paramserver_replication_seconds_count") >= steps
    assert value(p, "stalwart_paramserver_replication_lag_versions") == 0

    def checkpointed():  # checkpoint_interval 4: the coordinator asks the primary
        p = scrape(primary)
        assert value(p, "stalwart_checkpoints_total", result="complete") >= 1
        assert value(p, "stalwart_checkpoint_bytes") > 0
        assert value(p, "stalwart_checkpoint_stall_seconds_count") >= 1

    assert_eventually(checkpointed, timeout=20)
    c = scrape(coord)
    assert value(c, "stalwart_coordinator_is_leader") == 1
    assert value(c, "stalwart_coordinator_epoch") >= 1
    assert value(c, "stalwart_coordinator_leader_changes_seen_total") >= 1
    assert value(c, "stalwart_coordinator_nodes", role="trainer", state="alive") == 1
    assert value(c, "stalwart_coordinator_nodes", role="paramserver", state="alive") == 2
    assert value(c, "grpc_server_handled_total", grpc_method="Heartbeat") > 0


async def run_job(address: str, steps: int) -> coordinator.Job:
    async with CoordinatorClient(address) as client:
        deadline = time.monotonic() + 60
        while len(await client.all_nodes(common.NODE_ROLE_PARAMSERVER)) < 2:
            assert time.monotonic() < deadline, "paramservers did not register"
            await asyncio.sleep(0.2)
        # an evaluation at version 4, recorded before step 5 can start: a job series
        spec = job_spec(num_slots=1, steps=steps, checkpoint_interval=4, eval_every=4)
        job = await client.create_job(spec, job_id="dash-job")
        while time.monotonic() < deadline + 90:
            job = await client.get_job(job.job_id)
            if job.state in (coordinator.JOB_STATE_SUCCEEDED, coordinator.JOB_STATE_FAILED):
                return job
            await asyncio.sleep(0.2)
    raise AssertionError(f"job not finished: {job}")
