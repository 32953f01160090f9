"""GetFingerprint(at_version): every replica fingerprints exactly the asked version,
whenever the call arrives before it, so the coordinator can compare replicas while
training goes on."""

from __future__ import annotations

import asyncio

import grpc
import pytest
import torch

from tests.integration.paramserver.support import (
    consistency,
    expect_error,
    fingerprint,
    group_client,
    model_header,
    sgd,
    stubs,
)

pytestmark = pytest.mark.timeout(120)

JOB = "fingerprint-at"


async def test_replicas_answer_for_the_asked_version_only(shared_groups) -> None:
    group = shared_groups[0]
    client = group_client(group.addresses)
    init = {"w": torch.arange(8, dtype=torch.float32)}
    async with stubs() as stub_for:
        try:
            header = model_header(JOB, init, sgd(0.5), consistency("async"), num_slots=1)
            await client.register_model(header, list(init.values()))
            # asked before version 2 exists, on both replicas: answered when it is reached
            asked = [
                asyncio.create_task(fingerprint(stub_for(p.address), JOB, at_version=2))
                for p in group.replicas
            ]
            await asyncio.sleep(0.3)
            assert not any(t.done() for t in asked)
            for step in range(3):  # versions 1, 2, 3: the answers must not be of version 3
                await client.push(JOB, step, 0, step, {"w": torch.full((8,), float(step + 1))})
            primary, backup = await asyncio.gather(*asked)
            assert primary.version == backup.version == 2
            assert primary.combined == backup.combined
            now = await fingerprint(stub_for(group.primary.address), JOB)
            assert now.version == 3 and now.combined != primary.combined

            await expect_error(
                fingerprint(stub_for(group.backup.address), JOB, at_version=2),
                grpc.StatusCode.FAILED_PRECONDITION, "FAILED_PRECONDITION",
            )  # fmt: skip
            await expect_error(
                fingerprint(stub_for(group.primary.address), JOB, at_version=-1),
                grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT",
            )  # fmt: skip
            same = await fingerprint(stub_for(group.backup.address), JOB, at_version=3)
            assert (same.version, same.combined) == (3, now.combined)
        finally:
            await client.close()
