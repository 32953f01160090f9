"""`stalwart demo --model char-lm`, briefly: a small char-lm trained on a local cluster while
a trainer, the paramserver primary and the coordinator leader are killed; the report names
the model and its goal, and the final weights equal the fault-free run bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.cluster.test_cli import stalwart

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.timeout(600)]

SMALL = ("--arg", "dim=16", "--arg", "layers=1", "--arg", "heads=2", "--arg", "context=16")


def test_demo_trains_char_lm_through_the_kills(tmp_path: Path):
    done = stalwart("demo", "--model", "char-lm", "--steps", "40", *SMALL,
                    "--runs-root", str(tmp_path), "-o", "json", timeout=560)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    job, final = report["job"], report["final"]
    assert (job["model"], job["slots"], job["steps"], job["state"]) == (
        "char-lm", 2, 40, "SUCCEEDED")  # fmt: skip
    assert job["model_args"] == {"dim": "16", "layers": "1", "heads": "2", "context": "16"}
    assert report["steps"]["final_version"] == 40
    assert report["reference"] == {"computed": True, "bitwise_equal": True,
                                   "tensors_differing": []}  # fmt: skip
    assert final["goal"] == "loss ≤ 2.0 nats/byte" and final["examples_are"] == "held-out bytes"
    assert final["goal_met"] is (final["loss"] <= 2.0)
    assert 0 < final["loss"] < 10 and final["test_examples"] > 0
    kinds = [f["kind"] for f in report["faults"]]
    assert kinds and kinds == ["trainer", "paramserver", "coordinator"][: len(kinds)]
    assert all(f["recovery_s"] is not None for f in report["faults"])
    assert Path(report["html"]).exists()
    # the step timeline, from the services' own metrics: in the JSON and drawn on the page
    phases = report["step_ms"]
    assert phases["trainer.compute"] > 0 and phases["paramserver.commit"] > 0
    assert "Where a synchronous step goes" in Path(report["html"]).read_text()
