"""The trainer's device choice as plain code: parsing, one GPU per trainer by local index,
clear errors for GPUs that are not there, and the settings and start-up that use it."""

from __future__ import annotations

import pytest

from services.trainer import __main__ as trainer_main
from services.trainer.settings import TrainerSettings
from stalwart import devices
from stalwart.devices import DeviceChoice, DeviceError


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("auto", DeviceChoice("auto")),
        ("cpu", DeviceChoice("cpu")),
        ("cuda", DeviceChoice("cuda")),
        ("cuda:0", DeviceChoice("cuda", 0)),
        ("cuda:7", DeviceChoice("cuda", 7)),
        (" CUDA:2 ", DeviceChoice("cuda", 2)),
    ],
)
def test_parse(text, want):
    assert devices.parse(text) == want
    assert devices.parse(str(want)) == want  # str() is what the settings keep


@pytest.mark.parametrize("text", ["", "gpu", "cuda:", "cuda:-1", "cuda:x", "cpu:0", "auto:1",
                                  "cuda:1:2", "cuda: 1", "mps"])  # fmt: skip
def test_bad_device_strings_are_refused(text):
    with pytest.raises(DeviceError, match="expected auto, cpu, cuda or cuda:N"):
        devices.parse(text)


@pytest.mark.parametrize(
    ("text", "index", "count", "want"),
    [
        ("auto", 0, 0, "cpu"),  # no CUDA: the CPU, whatever the index
        ("auto", 5, 0, "cpu"),
        ("cpu", 3, 8, "cpu"),  # asked for the CPU: the CPU, GPUs or not
        ("auto", 0, 1, "cuda:0"),
        ("auto", 3, 4, "cuda:3"),  # one GPU per trainer
        ("auto", 5, 4, "cuda:1"),  # more trainers than GPUs: round-robin
        ("cuda", 2, 4, "cuda:2"),
        ("cuda", 4, 4, "cuda:0"),
        ("cuda:1", 0, 2, "cuda:1"),  # named: the same GPU for every local index
        ("cuda:1", 9, 2, "cuda:1"),
    ],
)
def test_select(text, index, count, want):
    assert devices.select(devices.parse(text), index, count) == want


def test_one_gpu_each_for_as_many_trainers_as_gpus():
    picked = [devices.select(DeviceChoice("auto"), i, 4) for i in range(4)]
    assert picked == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]


@pytest.mark.parametrize(
    ("text", "count", "message"),
    [
        ("cuda", 0, "device cuda: no CUDA device is visible on this machine"),
        ("cuda:0", 0, "device cuda:0: no CUDA device is visible on this machine"),
        ("cuda:1", 1, r"device cuda:1: only 1 CUDA device is visible \(cuda:0 to cuda:0\)"),
        ("cuda:4", 4, r"device cuda:4: only 4 CUDA devices are visible \(cuda:0 to cuda:3\)"),
    ],
)
def test_gpus_that_are_not_there_are_errors(text, count, message):
    with pytest.raises(DeviceError, match=f"^{message}$"):
        devices.select(devices.parse(text), 0, count)


def test_negative_local_index_is_refused():
    with pytest.raises(DeviceError, match="negative"):
        devices.select(DeviceChoice("auto"), -1, 2)


@pytest.mark.parametrize(
    ("configured", "environ", "want"),
    [
        (None, {}, 0),
        (None, {"LOCAL_RANK": "3"}, 3),  # torchrun's variable
        (2, {"LOCAL_RANK": "3"}, 2),  # the flag wins
        (None, {"LOCAL_RANK": " "}, 0),
    ],
)
def test_local_index(configured, environ, want):
    assert devices.local_index(configured, environ) == want


def test_bad_local_rank_is_refused():
    with pytest.raises(DeviceError, match="LOCAL_RANK='-1'"):
        devices.local_index(None, {"LOCAL_RANK": "-1"})


def test_decision_module_imports_no_torch():
    source = devices.__file__
    with open(source) as f:
        text = f.read()
    assert "import torch" not in text and "import grpc" not in text


# --- the trainer's settings and start-up ---------------------------------------------------


def test_settings_take_and_normalise_the_device():
    settings = TrainerSettings.from_args(
        ["--assignment-file", "a.json", "--device", "CUDA:1", "--local-index", "2"]
    )
    assert settings.device == "cuda:1" and settings.local_index == 2
    assert TrainerSettings(assignment_file="a.json").device == "auto"


@pytest.mark.parametrize("argv", [["--device", "gpu"], ["--local-index", "-1"]])
def test_settings_refuse_bad_device_flags(argv):
    with pytest.raises(ValueError):
        TrainerSettings.from_args(["--assignment-file", "a.json", *argv])


def test_start_up_without_cuda(monkeypatch):
    """This machine's real answer (no GPU here) for auto and cpu; a clear exit for cuda:N."""
    monkeypatch.setattr(trainer_main.torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    for device in ("auto", "cpu"):
        settings = TrainerSettings(assignment_file="a.json", device=device, local_index=1)
        assert trainer_main.pick_device(settings) == "cpu"
    settings = TrainerSettings(assignment_file="a.json", device="cuda:1")
    with pytest.raises(DeviceError, match="no CUDA device"):
        trainer_main.pick_device(settings)


def test_start_up_maps_local_index_to_a_gpu(monkeypatch):
    monkeypatch.setattr(trainer_main.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(trainer_main.torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert trainer_main.pick_device(TrainerSettings(assignment_file="a.json")) == "cuda:1"
    with pytest.raises(DeviceError, match="only 2 CUDA devices"):
        trainer_main.pick_device(TrainerSettings(assignment_file="a.json", device="cuda:2"))


def test_trainer_exits_2_with_one_error_line(monkeypatch, capsys):
    monkeypatch.setattr(trainer_main.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exit_info:
        trainer_main.main(["--assignment-file", "a.json", "--device", "cuda:0"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "Error: device cuda:0: no CUDA device is visible on this machine"


# --- stalwart up --device ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("gpu", "Error: --device: device 'gpu': expected auto, cpu, cuda or cuda:N (N >= 0)"),
        ("cuda:0", "Error: --device: device cuda:0: no CUDA device is visible on this machine"),
    ],
)
def test_up_refuses_a_device_it_cannot_give_before_starting_anything(
    monkeypatch, tmp_path, device, message
):
    import torch
    from typer.testing import CliRunner

    from stalwart.cli.main import app

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = CliRunner().invoke(app, ["up", "--device", device, "--runs-root", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines()[-1] == message
    assert list(tmp_path.iterdir()) == []  # no run folder: nothing was started


def test_cluster_gives_each_trainer_its_device_flag_and_local_index():
    from stalwart import cluster

    config = cluster.ClusterConfig(trainers=2, standbys=1, device="cuda")
    spec = cluster._trainer_spec("standby-0", ["127.0.0.1:1"], True, config, 2)
    args = list(spec.args)
    assert args[args.index("--device") + 1] == "cuda"
    assert args[args.index("--local-index") + 1] == "2"
    assert spec.local_index == 2 and "--standby" in args
    default = cluster._trainer_spec("trainer-0", ["127.0.0.1:1"], False, cluster.ClusterConfig(), 0)
    assert list(default.args)[list(default.args).index("--device") + 1] == "auto"


def test_what_goes_on_the_wire_is_contiguous_cpu_and_bitwise_repeatable():
    """compute_step hands the push contiguous CPU copies (gradients and buffers), whatever
    the model's device; on the CPU that auto picks here, two trainers agree bit for bit."""
    import torch

    from stalwart import models, training

    spec = models.default_spec("tests.unit.training.dropout_task:make", num_slots=2,
                               batch_size=8, micro_batches=2)  # fmt: skip
    task = models.resolve(spec)
    device = devices.select(devices.parse("auto"), 0, 0)
    results = []
    for _ in range(2):  # two fresh "trainers"
        model = task.build_model(spec.seed).to(device)
        results.append(training.compute_step(task, model, 1, 3, spec))
    first, second = results
    assert "1.running_mean" in first.grads  # buffers travel with the gradient
    for name, tensor in first.grads.items():
        assert tensor.device.type == "cpu" and tensor.is_contiguous(), name
        assert torch.equal(tensor, second.grads[name]), name
