"""Network faults: every service on a host of its own (a network namespace with its own
address, see netns.py), links cut and restored, and the paramserver primary cut off
from the coordinators while it still reaches the trainers and its backup. Each job
ends SUCCEEDED, with every step applied once and weights bitwise equal to a
fault-free run, and the cluster whole again after the fault.

Needs root and iproute2; skipped otherwise, except under STALWART_REQUIRE_BACKENDS=1
(``make test``, CI), where a missing capability fails the test.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from stalwart import cluster
from stalwart.api import coordinator
from tests.chaos import netns, runner
from tests.chaos.schedule import Fault
from tests.helpers import PRELOAD
from tests.integration.cluster.support import assert_bitwise_equal, reference, small_spec

STEPS = 200
STEP_DELAY = "delay_s=0.05"  # so the job outlasts the outage (see test_schedules)
OUTAGE_S = 5.0  # longer than the coordinator's 3 s floor for declaring a node dead
AT_STEP = 40
CONFIG = dict(trainers=2, standbys=1, backups=1, spares=1, coordinators=2)
#: The members cluster.start makes for CONFIG, each given a host of its own.
MEMBERS = ["coord-0", "coord-1", "ps-0a", "ps-0b", "ps-0c", "trainer-0", "trainer-1",
           "standby-0"]  # fmt: skip

pytestmark = pytest.mark.timeout(600)

SCENARIOS = {
    "backup-link-cut": Fault(AT_STEP, "cut", "backup", stop_s=OUTAGE_S),
    "trainer-link-cut": Fault(AT_STEP, "cut", "trainer", stop_s=OUTAGE_S),
    "primary-link-cut": Fault(AT_STEP, "cut", "primary", stop_s=OUTAGE_S),
    "leader-link-cut": Fault(AT_STEP, "cut", "leader", stop_s=OUTAGE_S),
    # the primary keeps its trainers and backup but loses every coordinator
    "primary-partitioned-from-coordinators": Fault(
        AT_STEP, "partition", "primary", stop_s=OUTAGE_S
    ),
}


@pytest.fixture
def net():
    netns.require()
    test_net = netns.TestNet.create(MEMBERS)
    try:
        yield test_net
    finally:
        test_net.remove()


@pytest.fixture(scope="module")
def fault_free() -> dict:
    return reference(small_spec(steps=STEPS, seed=7))


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_network_fault_ends_succeeded_and_bitwise_equal(
    scenario: str, net: netns.TestNet, fault_free, tmp_path: Path
) -> None:
    fault = SCENARIOS[scenario]
    config = cluster.ClusterConfig(
        **CONFIG, runs_root=tmp_path, preload_services=PRELOAD, hosts=net.hosts,
        trainer_env={"STALWART_FAULTS": STEP_DELAY},
    )  # fmt: skip
    local = cluster.start(config)
    print(f"\n{scenario}: {fault.describe()}; logs: {local.log_dir}")
    try:
        assert {m.name for m in local.members} == set(net.hosts), "a member runs on loopback"
        assert all(m.address.startswith(net.hosts[m.name].ip + ":") for m in local.members)
        asyncio.run(cluster.wait_healthy(local, runner.HEALTHY_WITHIN_S))
        out = asyncio.run(runner.run(local, small_spec(steps=STEPS, seed=7), [fault], net))
    finally:
        local.stop(timeout_s=10)
    print("applied: " + "; ".join(f"{a.fault.action} {a.target} at {a.step}" for a in out.applied))
    assert [a.fault for a in out.applied] == [fault], "the fault never landed"
    assert out.job.state == coordinator.JOB_STATE_SUCCEEDED, out.job.reason
    assert out.version == STEPS
    assert_bitwise_equal(out.weights, fault_free)
