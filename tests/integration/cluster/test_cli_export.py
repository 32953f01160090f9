"""`stalwart job export` against a local cluster: the weights equal what the paramservers
serve, the optimizer state equals what they hold (fingerprint by fingerprint, and bitwise
against the job's own checkpoint), and a given version or checkpoint exports what it held."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from safetensors.torch import load_file

from stalwart import checkpoint as ckpt
from stalwart import codec, exporting, optim, training
from stalwart.client.coordinator import CoordinatorClient
from stalwart.demo.watch import param_client, pull_weights
from stalwart.errors import ErrorKind, StalwartError
from stalwart.models import resolve
from stalwart.stores import open_store
from tests.integration.cluster.test_cli import EXIT_INVALID_INPUT, one_error_line, stalwart
from tests.integration.cluster.test_cli_training import assert_equal, submit

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def export(target, job_id, path, *flags):
    """`stalwart job export` (a CLI process: torch's import alone is slow on a busy machine)."""
    out = stalwart("job", "export", job_id, "-o", str(path), "--output", "json", *flags, *target,
                   timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


async def served(local, job_id: str, spec):
    """What the job's paramservers serve and hold: (version, weights, fingerprints), and
    the job's checkpoints."""
    async with CoordinatorClient(local.coordinator_addresses, retry_for_s=30.0) as client:
        ps = await param_client(client, job_id, spec)
        try:
            version, weights = await pull_weights(ps, job_id, spec.steps)
            prints = await ps.groups[0].fingerprint(job_id)
        finally:
            await ps.close()
        saved = await exporting.job_checkpoints(client, job_id)
    return version, weights, {t.name: t.crc32c for t in prints.tensors}, saved


async def at_version(local, job_id: str, version: int) -> exporting.Exported:
    """The Python API beside the CLI: stalwart.exporting.at_version."""
    async with CoordinatorClient(local.coordinator_addresses, retry_for_s=30.0) as client:
        return await exporting.at_version(client, job_id, version, optimizer_state=True)


def test_export_weights_optimizer_state_version_and_checkpoint(local, tmp_path):
    target = ("--coordinator", ",".join(local.coordinator_addresses))
    spec, job_id = submit(target, "--steps", "12", "--optimizer", "adamw", "--lr", "0.02",
                          "--schedule", "cosine", "--warmup-steps", "3",
                          "--checkpoint-interval", "2")  # fmt: skip
    version, weights, prints, saved = asyncio.run(served(local, job_id, spec))
    assert version == spec.steps

    model_file, opt_file = tmp_path / "m.safetensors", tmp_path / "m.optim.safetensors"
    record = export(target, job_id, model_file, "--optimizer-state", str(opt_file))
    assert (record["version"], record["source"]) == (12, "live")
    assert_equal(load_file(str(model_file)), weights)  # exported == pulled
    state = load_file(str(opt_file))
    assert record["optimizer_tensors"] == len(state) > 0
    params = [n for n in weights if n in dict(resolve(spec).build_model(0).named_parameters())]
    assert sorted(state) == sorted(f"{n}/{k}" for n in params for k in ("exp_avg", "exp_avg_sq",
                                                                         "step"))  # fmt: skip
    # what the primary holds, tensor by tensor (its fingerprints cover the optimizer state)
    assert {n: codec.tensor_crc32c(t) for n, t in state.items()} == {
        n: c for n, c in prints.items() if "/" in n
    }
    assert all(float(state[f"{n}/step"]) == 12 for n in params)

    # --checkpoint and --version: what a checkpoint holds, bitwise what reference_run reaches
    # at its step and what the store holds. Periodic checkpoints land on the marks (every
    # 2 steps) unless a fast job outran a save: the catch-up then lands on the newest
    # version the primaries could snapshot (docs/checkpoints.md), any step. Take the newest
    # before the end, which retention keeps should the last order publish one more.
    by_step = {m.step: m for m in saved}
    assert by_step and all(0 < s <= 12 for s in by_step), sorted(by_step)
    step = max([s for s in by_step if s < 12] or [12])
    chosen = by_step[step].checkpoint_id
    with open_store(by_step[step].store_url) as store:
        manifest = ckpt.load_manifest(store, job_id, chosen)
        stored, _ = ckpt.read_tensors(store, list(manifest.tensors))
    training.make_deterministic(1)
    at_step = training.reference_run(spec, steps=step)
    rec = export(target, job_id, tmp_path / "c.pt", "--checkpoint", chosen, "--format", "torch",
                 "--optimizer-state", str(tmp_path / "c.optim.pt"))  # fmt: skip
    assert (rec["version"], rec["source"]) == (step, chosen)
    assert_equal(torch.load(tmp_path / "c.pt", weights_only=True), at_step)
    state_c = torch.load(tmp_path / "c.optim.pt", weights_only=True)
    assert_equal(state_c, {n: t for n, t in stored.items() if "/" in n})
    assert sorted(state_c) == sorted(state)
    assert all(float(state_c[f"{n}/step"]) == step for n in params)
    by_version = asyncio.run(at_version(local, job_id, step))
    assert (by_version.version, by_version.source) == (step, chosen)
    assert_equal(by_version.weights, at_step)
    assert_equal(by_version.optimizer, state_c)
    last = asyncio.run(at_version(local, job_id, 12))  # the checkpoint at 12, or the live state
    assert last.version == 12
    assert_equal(last.weights, weights)
    assert_equal(last.optimizer, state)

    # the file goes back into a torch optimizer over the model, bit for bit
    model = resolve(spec).build_model(spec.seed)
    training.load_params(model, load_file(str(model_file)))
    opt = optim.build(spec.optimizer, list(model.parameters()))
    exporting.load_optimizer_state(opt, model, opt_file)
    assert_equal(exporting.state_of(opt, dict(model.named_parameters())), state)

    # a checkpoint read from a folder that holds no store: refused, and no store made there
    elsewhere = tmp_path / "not-a-store"
    elsewhere.mkdir()
    wrong = stalwart("job", "export", job_id, "-o", str(tmp_path / "w.st"), "--checkpoint",
                     chosen, "--store-url", f"shm://{elsewhere}", *target)  # fmt: skip
    assert wrong.returncode == EXIT_INVALID_INPUT, wrong.stderr
    assert f"no store at shm://{elsewhere}" in one_error_line(wrong)
    assert list(elsewhere.iterdir()) == [] and not (tmp_path / "w.st").exists()

    # a version past the end of an ended job: refused at once (it used to wait 15 s)
    past = stalwart("job", "export", job_id, "-o", str(tmp_path / "p.st"), "--min-version",
                    "5000", *target)  # fmt: skip
    assert past.returncode == EXIT_INVALID_INPUT, past.stderr
    assert "has ended at version 12; it will never reach --min-version 5000" in one_error_line(past)

    # a version the job neither holds nor checkpointed: refused, naming the saved steps
    missing = min(set(range(1, 12)) - set(by_step))
    with pytest.raises(StalwartError, match=f"no checkpoint at step {missing}") as refused:
        asyncio.run(at_version(local, job_id, missing))
    assert refused.value.kind is ErrorKind.FAILED_PRECONDITION
    assert "checkpoints at steps: [" in refused.value.message and str(step) in refused.value.message


@pytest.mark.parametrize(
    "flags, message",
    [
        (("--checkpoint", "x.s4.ab", "--version", "4"), "--checkpoint fixes the version"),
        (("--version", "4", "--min-version", "2"), "not both"),
        (("--optimizer-state", "OUT"), "another file than -o"),
        (("--format", "npz"), "--format must be one of"),
    ],
)
def test_bad_export_flags_get_one_error_line(local, tmp_path, flags, message):
    target = ("--coordinator", ",".join(local.coordinator_addresses))
    out = tmp_path / "out.safetensors"
    flags = tuple(str(out) if f == "OUT" else f for f in flags)
    bad = stalwart("job", "export", "some-job", "-o", str(out), *flags, *target)
    assert bad.returncode == EXIT_INVALID_INPUT, bad.stderr
    assert message in one_error_line(bad)
    assert not out.exists()
