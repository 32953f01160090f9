"""seeded_global_rng: the same draws as torch.manual_seed, the caller's RNG untouched."""

import pytest
import torch

from stalwart.models import base


@pytest.mark.parametrize("cuda_impossible", [True, False])
def test_draws_equal_torch_manual_seed_and_the_callers_rng_comes_back(monkeypatch, cuda_impossible):
    monkeypatch.setattr(base, "_cuda_impossible", lambda: cuda_impossible)
    torch.manual_seed(123)
    expected_after = torch.rand(4)
    torch.manual_seed(123)
    with base.seeded_global_rng(7):
        inside = torch.rand(5)
    assert torch.equal(torch.rand(4), expected_after)  # the caller's stream went on as if untouched
    torch.manual_seed(7)
    assert torch.equal(inside, torch.rand(5))


def test_cuda_impossible_reads_the_driver_files(monkeypatch):
    base._cuda_impossible.cache_clear()
    seen = []

    def exists(path):
        seen.append(path)
        return path == "/dev/nvidiactl"

    monkeypatch.setattr(base.os.path, "exists", exists)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    try:
        assert base._cuda_impossible() is False
        assert "/dev/nvidiactl" in seen
        base._cuda_impossible.cache_clear()
        monkeypatch.setattr(base.os.path, "exists", lambda path: False)
        assert base._cuda_impossible() is True
    finally:
        base._cuda_impossible.cache_clear()
