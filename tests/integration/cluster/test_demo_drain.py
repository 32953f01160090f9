"""`stalwart demo` with the health service (the default): trainer-0 heats up from 8% of
the steps and has a scripted death at 22%; the health service predicts the failure from
its telemetry, the coordinator drains it before the death, and the run still ends
bitwise equal to the fault-free reference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.cluster.test_cli import stalwart

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.timeout(1500)]

# 200 steps: heat from step 16, death at 44. The drain races the steps, and 28 steps of
# margin is what tests/integration/sdc/test_health_drain.py needs on a loaded machine.
STEPS = 200


def test_demo_drains_the_heated_trainer_before_its_death(tmp_path: Path):
    done = stalwart("demo", "--steps", str(STEPS), "--runs-root", str(tmp_path), "-o", "json",
                    timeout=1400)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    drain = report["health_drain"]
    assert (drain["node"], drain["heat_from_step"], drain["crash_at_step"]) == (
        "trainer-0", 16, 44)  # fmt: skip
    assert drain["drained"] and not drain["crash_fired"] and drain["ok"], drain
    assert 16 <= drain["drained_at_step"] < 44
    assert "health service predicts a failure" in drain["reason"] and "GPU at" in drain["reason"]
    drained = [e for e in report["events"] if e["kind"] == "NODE_DRAINED"]
    assert [e["node"] for e in drained] == ["trainer-0"]
    assert report["job"]["state"] == "SUCCEEDED"
    assert report["steps"]["final_version"] == STEPS
    assert report["reference"] == {"computed": True, "bitwise_equal": True,
                                   "tensors_differing": []}  # fmt: skip
