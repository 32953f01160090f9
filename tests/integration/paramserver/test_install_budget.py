"""A backup refuses a whole-job install it has no memory for, as RegisterModel does
on a primary: before a byte of the state is read, with the size in the message, and
holding nothing of it. It used to allocate whatever a primary (or a hostile client
with the epoch) sent, until the OOM killer took every job it held."""

from __future__ import annotations

import grpc
import pytest
import torch

from stalwart import codec
from stalwart.api import paramserver
from tests.integration.paramserver.support import (
    call,
    configure_backup,
    consistency,
    expect_error,
    model_header,
    sgd,
    status,
    stubs,
)

pytestmark = pytest.mark.timeout(120)

EPOCH = 3
BUDGET = 8 << 20  # bytes; a job of N float32 parameters, SGD, 1 slot takes about 4 * 4N


def _install(stub, job_id: str, numel: int):
    params = {"w": torch.arange(numel, dtype=torch.float32)}
    header = paramserver.InstallStateHeader(
        epoch=EPOCH,
        model=model_header(job_id, params, sgd(0.1), consistency("sync"), 1, EPOCH),
        version=7,
        tensors=[codec.spec_of(n, t) for n, t in params.items()],
    )
    messages = [paramserver.InstallStateRequest(header=header)]
    messages += [paramserver.InstallStateRequest(chunk=c)
                 for c in codec.encode_chunks(list(params.values()))]  # fmt: skip
    return call(stub.InstallState(iter(messages), timeout=30))


async def test_an_install_beyond_the_budget_is_refused_and_nothing_is_held(launcher):
    backup = launcher.start("b", "--role", "backup", "--memory-budget-bytes", str(BUDGET))
    async with stubs() as stub_for:
        stub = stub_for(backup.address)
        await configure_backup(stub, EPOCH)
        large = 1 << 20  # 4 MiB of parameters: about 16 MiB held
        err = await expect_error(
            _install(stub, "large", large), grpc.StatusCode.RESOURCE_EXHAUSTED, "LIMIT_EXCEEDED"
        )
        assert "the model of job 'large' needs about 16 MiB" in err.message
        assert "has 8 MiB of room" in err.message
        assert [j.job_id for j in (await status(stub)).jobs] == []
        # within the budget: taken, at the primary's version
        answer = await _install(stub, "small", 1 << 16)
        assert answer.version == 7
        assert [j.job_id for j in (await status(stub)).jobs] == ["small"]
        # a second install of the held job replaces it and is not counted twice
        assert (await _install(stub, "small", 1 << 18)).version == 7
        # beside the 4 MiB it now holds, a job of 8 MiB does not fit
        await expect_error(
            _install(stub, "other", 1 << 19), grpc.StatusCode.RESOURCE_EXHAUSTED, "LIMIT_EXCEEDED"
        )
