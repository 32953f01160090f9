import pytest
import torch

from services.health import datasets


@pytest.fixture(autouse=True)
def _one_thread():
    # The test machines are shared; keep torch on one core like the evaluation does.
    torch.set_num_threads(1)


def load_or_skip(loader, *args):
    try:
        return loader(*args)
    except datasets.DatasetMissing as e:
        pytest.skip(str(e).splitlines()[0])
