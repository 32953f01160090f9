"""Optimizer state out of a job: pieces joined across shard groups, the file and its way
back into a torch optimizer, bit for bit."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from stalwart import exporting, optim, shardmap
from stalwart.api import common

SPLIT = 150  # bytes: the two matrices below are split by rows across the shard groups


def params() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {
        "embed.weight": torch.randn(10, 8, generator=g),
        "fc.weight": torch.randn(7, 6, generator=g),
        "fc.bias": torch.randn(7, generator=g),
        "scale": torch.randn((), generator=g),
    }


def grads(step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return {n: torch.randn(t.shape, generator=g) for n, t in params().items()}


SPEC = common.OptimizerSpec(kind=common.OPTIMIZER_KIND_ADAMW, lr=0.01, weight_decay=0.1)


def train(tensors: dict[str, torch.Tensor], grad_of, steps: int = 3) -> torch.optim.Optimizer:
    opt = optim.build(SPEC, list(tensors.values()))
    for step in range(steps):
        for name, p in tensors.items():
            p.grad = grad_of(step)[name]
        opt.step()
    return opt


def test_state_joined_from_shard_groups_equals_one_optimizer_over_whole_tensors():
    whole = {n: t.clone() for n, t in params().items()}
    want = exporting.state_of(train(whole, grads), whole)

    pieces = shardmap.build_shard_map(shardmap.shapes_of(params()), 2, split_bytes=SPLIT)
    assert any(not p.whole for p in pieces)  # the test needs a tensor split by rows
    per_shard = []
    for shard, own in enumerate(shardmap.split(params(), pieces, 2)):
        held = {n: t.clone() for n, t in own.items()}

        def piece_grads(step: int, shard: int = shard) -> dict[str, torch.Tensor]:
            return shardmap.split(grads(step), pieces, 2)[shard]

        per_shard.append(exporting.state_of(train(held, piece_grads), held))
    got = shardmap.join_state(per_shard, pieces)
    assert sorted(got) == sorted(want)
    assert "embed.weight/exp_avg_sq" in got and got["embed.weight/step"].dim() == 0
    for name in want:
        assert torch.equal(got[name], want[name]), name


def test_pieces_that_disagree_are_an_error():
    pieces = shardmap.build_shard_map(shardmap.shapes_of(params()), 2, split_bytes=SPLIT)
    split = [p for p in pieces if p.tensor_name == "embed.weight"]
    per_shard = [{}, {}]
    for i, p in enumerate(split):
        per_shard[p.shard][f"{p.piece_name}/step"] = torch.tensor(float(i + 1))
    with pytest.raises(ValueError, match="embed.weight/step differs"):
        shardmap.join_state(per_shard, pieces)


def test_names_that_are_no_piece_are_left_out():
    pieces = shardmap.build_shard_map(shardmap.shapes_of(params()), 1)
    got = shardmap.join_state([{"fc.bias": torch.zeros(7), "nope/exp_avg": torch.zeros(1),
                                "fc.bias/exp_avg": torch.ones(7)}], pieces)  # fmt: skip
    assert sorted(got) == ["fc.bias/exp_avg"]


def test_optimizer_file_carries_metadata_and_loads_into_a_torch_optimizer(tmp_path):
    whole = {n: t.clone() for n, t in params().items()}
    opt = train(whole, grads)
    exported = exporting.Exported("j1", 3, "live", whole, SPEC, exporting.state_of(opt, whole))
    model_file, opt_file = tmp_path / "m.safetensors", tmp_path / "m.optim.safetensors"
    size = exporting.save(exported, model_file, "safetensors", opt_file)
    assert size == sum(t.numel() * t.element_size()
                       for t in [*whole.values(), *exported.optimizer.values()])  # fmt: skip
    with safe_open(str(opt_file), "pt") as f:
        meta = f.metadata()
    assert meta["format"] == exporting.OPTIMIZER_FORMAT
    assert (meta["job"], meta["version"], meta["source"]) == ("j1", "3", "live")
    assert '"OPTIMIZER_KIND_ADAMW"' in meta["optimizer"]

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            for name, t in whole.items():
                self.register_parameter(name.replace(".", "_"), torch.nn.Parameter(t.clone()))

    net = Net()
    fresh = optim.build(SPEC, list(net.parameters()))
    renamed = tmp_path / "renamed.safetensors"  # the module's own names
    from safetensors.torch import save_file

    save_file({k.replace(".", "_", 1) if k.count("/") else k: v
               for k, v in exported.optimizer.items()}, str(renamed))  # fmt: skip
    exporting.load_optimizer_state(fresh, net, renamed)
    loaded = exporting.state_of(fresh, dict(net.named_parameters()))
    for name, value in exported.optimizer.items():
        assert torch.equal(loaded[name.replace(".", "_", 1)], value), name
    with pytest.raises(Exception, match="unknown 'embed.weight'"):
        exporting.load_optimizer_state(fresh, net, opt_file)


def test_cli_knows_the_formats_without_importing_torch():
    from stalwart import weights
    from stalwart.cli import export

    assert export.FORMATS == weights.FORMATS
