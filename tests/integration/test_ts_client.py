"""The TypeScript client against a live local cluster: the wire contract from Node.js.

Builds clients/typescript (npm ci from its lock file when node_modules is
missing, ts-proto generation from protos/, tsc), runs its unit checks
(`node --test`), then its live script: list nodes, submit a job with the
optional fields left to the coordinator's defaults, follow it to the end and
pull the final weights with every chunk's CRC32C checked. The weights must equal,
bitwise, what the Python client pulls. Skips when Node.js is not installed,
unless STALWART_REQUIRE_BACKENDS=1.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest

from stalwart.api import coordinator
from stalwart.jobspec import MODEL_DEFAULTS
from tests.integration.clients_live import (
    assert_same_weights,
    finished_job,
    live_cluster,
    missing_tools,
    run_in,
)

TS_DIR = Path(__file__).resolve().parents[2] / "clients" / "typescript"
STEPS = 5
_run = partial(run_in, TS_DIR)

if skip_reason := missing_tools("node", "npm"):
    pytestmark = pytest.mark.skip(reason=skip_reason)


@pytest.fixture(scope="module")
def ts_client() -> Path:
    if not (TS_DIR / "node_modules" / ".bin" / "tsc").exists():
        _run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], timeout=600)
    _run(["bash", "generate.sh"], timeout=300)
    _run(["node_modules/.bin/tsc", "-p", "tsconfig.json"], timeout=300)
    return TS_DIR


@pytest.mark.timeout(300)
def test_ts_helpers_unit(ts_client: Path) -> None:
    out = _run(["node", "--test", "dist/test/"], timeout=240).stdout
    assert "# fail 0" in out and "# pass 4" in out, out


@pytest.mark.timeout(1200)
def test_ts_client_runs_a_job_and_pulls_the_python_clients_weights(ts_client, run_dir):
    with live_cluster(run_dir, "ts-client") as c:
        addresses = c.coordinator_addresses
        dump = run_dir / "ts-client-weights.json"
        result = _run(
            ["node", "dist/scripts/live.js", str(STEPS)], timeout=900,
            STALWART_COORDINATOR=",".join(addresses), STALWART_WEIGHTS_OUT=str(dump),
        )  # fmt: skip
        out = result.stdout
        # primary, backup and warm spare, and the trainer
        assert "nodes: 4 " in out and "NODE_ROLE_TRAINER" in out, out
        assert "finished: JOB_STATE_SUCCEEDED" in out, out
        job_id = assert_same_weights(dump, addresses)
        job = finished_job(addresses, job_id)
    assert job.state == coordinator.JOB_STATE_SUCCEEDED and job.step == STEPS
    # The TS client sent only model, steps and seed: the rest are the server's defaults.
    mlp = MODEL_DEFAULTS["mlp"]
    assert (job.spec.num_slots, job.spec.batch_size) == (mlp["slots"], mlp["batch_size"])
    assert job.spec.optimizer.lr == mlp["lr"]
