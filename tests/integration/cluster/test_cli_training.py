"""The update-rule flags, `job export` and `--init-from` through the CLI against a local
cluster: exported tensors equal the weights reference_run computes for the job's stored
spec, bit for bit, and a job started from the file continues from them."""

from __future__ import annotations

import json

import pytest
import torch
from google.protobuf import json_format
from safetensors.torch import load_file

from stalwart import training
from stalwart.api import common, coordinator
from tests.integration.cluster.test_cli import EXIT_INVALID_INPUT, one_error_line, stalwart

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

MODEL = "tests.unit.training.dropout_task:make"


def submit(target, *flags):
    done = stalwart("job", "submit", "--model", MODEL, "--slots", "2", "--batch-size", "8",
                    "--wait", "-o", "json", *flags, *target, timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stderr
    job = json.loads(done.stdout)
    assert job["state"] == "JOB_STATE_SUCCEEDED", job
    return json_format.ParseDict(job["spec"], coordinator.JobSpec()), job["job_id"]


def export(target, job_id, path, *flags):
    out = stalwart("job", "export", job_id, "-o", str(path), "--output", "json", *flags, *target)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def assert_equal(got, want):
    assert sorted(got) == sorted(want)
    for name in want:
        assert torch.equal(got[name], want[name]), name


def test_flags_export_and_init_from(local, tmp_path):
    target = ("--coordinator", ",".join(local.coordinator_addresses))
    spec, job_id = submit(target, "--steps", "12", "--optimizer", "adamw", "--lr", "0.02",
                          "--beta2", "0.95", "--weight-decay", "0.01", "--schedule", "cosine",
                          "--warmup-steps", "3", "--clip-grad-norm", "0.5",
                          "--micro-batches", "2")  # fmt: skip
    opt = spec.optimizer
    assert (opt.beta2, opt.clip_grad_norm, spec.micro_batches) == (0.95, 0.5, 2)
    assert opt.schedule.kind == common.LR_SCHEDULE_KIND_COSINE
    assert opt.schedule.decay_steps == 9  # filled in on admission: 12 steps - 3 of warmup
    training.make_deterministic(1)
    want = training.reference_run(spec)

    file = tmp_path / "model.safetensors"
    record = export(target, job_id, file)
    assert record["version"] == 12 and record["tensors"] == len(want)
    exported = load_file(str(file))
    assert "1.running_mean" in exported  # buffers travel too
    assert_equal(exported, want)
    as_torch = tmp_path / "model.pt"
    export(target, job_id, as_torch, "--format", "torch")
    assert_equal(torch.load(as_torch, weights_only=True), want)

    spec2, job2 = submit(target, "--steps", "4", "--init-from", str(file), "--seed", "9")
    assert spec2.init_from == str(file)
    expected = training.reference_run(spec2)
    seeded = coordinator.JobSpec()
    seeded.CopyFrom(spec2)
    seeded.init_from = ""
    assert not torch.equal(expected["0.weight"], training.reference_run(seeded)["0.weight"])
    export(target, job2, tmp_path / "second.safetensors")
    assert_equal(load_file(str(tmp_path / "second.safetensors")), expected)


@pytest.mark.parametrize(
    "flags, message",
    [
        (("--init-from", "/no/such/file.safetensors"), "no such file"),
        (("--schedule", "step"), "step_size"),
        (("--clip-grad-norm", "1", "--shards", "2"), "num_shards 1"),
        (("--micro-batches", "100"), "micro_batches"),
        (("--optimizer", "adam", "--beta1", "1.5"), "beta1"),
        (("--mode", "async", "--shards", "2"), "ASYNC and SSP need num_shards 1"),
    ],
)
def test_bad_update_rule_flags_get_one_error_line(local, flags, message):
    target = ("--coordinator", ",".join(local.coordinator_addresses))
    bad = stalwart("job", "submit", *flags, *target)
    assert bad.returncode == EXIT_INVALID_INPUT, bad.stderr
    assert message in one_error_line(bad)
