"""`stalwart demo` options down to the demo's config, and bad ones refused before any
process starts."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from stalwart.cli.main import app
from stalwart.demo import report
from stalwart.demo import run as demo_run


@pytest.fixture
def captured(monkeypatch):
    """The DemoConfig the CLI builds; the run itself stops at once (a TimeoutError)."""
    seen = []

    async def fake_run(config, progress=None):
        seen.append(config)
        raise TimeoutError("stopped by the test")

    monkeypatch.setattr(demo_run, "run", fake_run)
    return seen


def invoke(tmp_path, *args):
    return CliRunner().invoke(app, ["demo", "--runs-root", str(tmp_path), *args])


def test_default_is_digits_cnn_with_its_defaults(tmp_path, captured):
    result = invoke(tmp_path)
    assert result.exit_code == 1 and "stopped by the test" in result.output
    (config,) = captured
    assert (config.model, config.steps, config.trainers, config.model_args) == (
        "digits-cnn", 400, 3, {})  # fmt: skip


def test_char_lm_takes_its_own_defaults_and_arguments(tmp_path, captured):
    invoke(tmp_path, "--model", "char-lm", "--arg", "layers=1", "--arg", "dim=32")
    (config,) = captured
    assert (config.model, config.steps, config.trainers) == ("char-lm", 300, 2)
    assert config.model_args == {"layers": "1", "dim": "32"}
    spec = demo_run.job_spec(config)
    assert spec.model == "char-lm" and spec.num_slots == 2 and spec.micro_batches == 2
    assert spec.optimizer.clip_grad_norm == 1.0  # char-lm's training recipe comes along


def test_steps_and_trainers_override(tmp_path, captured):
    invoke(tmp_path, "--model", "char-lm", "--steps", "8", "--trainers", "3")
    assert (captured[0].steps, captured[0].trainers) == (8, 3)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "char-lm", "--width", "8"], "--width is digits-cnn's"),
        (["--model", "char-lm", "--arg", "layers"], "expected key=value"),
        (["--model", "char-lm", "--arg", "layers=x"], "layers"),
        (["--model", "no-such-model"], "no-such-model"),
    ],
)
def test_bad_options_exit_2_before_anything_starts(tmp_path, captured, args, message):
    result = invoke(tmp_path, *args)
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines()[-1].startswith("Error: ")
    assert message in result.output
    assert captured == [] and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "model, metrics, want",
    [
        ("digits-cnn", {"accuracy": 0.98, "loss": 0.1}, ("accuracy ≥ 97%", True)),
        ("digits-cnn", {"accuracy": 0.90, "loss": 0.1}, ("accuracy ≥ 97%", False)),
        ("char-lm", {"accuracy": 0.4, "loss": 1.9}, ("loss ≤ 2.0 nats/byte", True)),
        ("char-lm", {"accuracy": 0.4, "loss": 2.5}, ("loss ≤ 2.0 nats/byte", False)),
        ("mlp", {"accuracy": 0.4, "loss": 2.5}, ("none set", None)),
    ],
)
def test_goal_per_model(model, metrics, want):
    got = report.goal(model, metrics)
    assert (got["goal"], got["goal_met"]) == want


@pytest.mark.parametrize("steps, heated", [(40, False), (400, True)])
def test_only_a_run_long_enough_heats_a_trainer(tmp_path, steps, heated):
    config = demo_run.DemoConfig(model="char-lm", steps=steps, trainers=2, standbys=1,
                                 seed=0, model_args={}, reference=False, runs_root=tmp_path)  # fmt: skip
    cluster_config = demo_run.cluster_config(config)
    assert (demo_run.HEATED in cluster_config.member_args) is heated
    assert cluster_config.standbys == 1 + heated  # the heated trainer's own stand-in
