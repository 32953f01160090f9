"""A whole cluster with role tokens configured, as the Kubernetes manifests run it:
every process holds the tokens, so every call between them (the coordinator's
heartbeats and polls, the trainers' pushes and pulls, the primary's replication
stream) must carry one. A job runs to the end, bitwise equal to the reference run,
and a pull without a token is refused."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from stalwart import training
from stalwart.api import coordinator, paramserver
from stalwart.channel import open_channel
from stalwart.client import CoordinatorClient
from stalwart.client.paramserver import ParamServerStub
from tests.helpers import assert_eventually_async

from .support import assert_bitwise_equal, final_weights, small_spec, wait_trainers
from .test_trainer_with_coordinator import wait_job_done

pytestmark = pytest.mark.timeout(300)

TOKENS = {
    "STALWART_ADMIN_TOKEN": "adm-secret",
    "STALWART_NODE_TOKEN": "node-secret",
    "STALWART_VIEWER_TOKEN": "viewer-secret",
}


async def _leader(client: CoordinatorClient) -> None:
    async def leads():
        assert (await client.cluster_status()).epoch > 0

    await assert_eventually_async(leads, timeout=60)


async def test_a_cluster_with_tokens_trains_to_the_end_bitwise(cluster_procs):
    procs = cluster_procs
    spec = small_spec(steps=12)
    training.make_deterministic()
    want = await asyncio.to_thread(training.reference_run, spec)

    store = ("--store-url", procs.store_url, "--store-prefix", procs.prefix)
    coord = procs.start("services.coordinator", "c1", *store, env=TOKENS)
    join = ("--coordinator", coord.address)
    backup = procs.start("services.paramserver", "ps-b", "--role", "backup", *join, env=TOKENS)
    primary = procs.start("services.paramserver", "ps-p", "--role", "primary",
                          "--backups", backup.address, *join, env=TOKENS)  # fmt: skip
    for name in ("tr0", "tr1"):
        procs.start("services.trainer", name, *join, env=TOKENS)

    async with CoordinatorClient(coord.address, token="adm-secret") as client:
        await _leader(client)
        await wait_trainers(client, {"tr0", "tr1"}, 60)
        job = await client.create_job(spec, job_id="job-secured")
        done = await wait_job_done(client, job.job_id, 180)
        assert done.state == coordinator.JOB_STATE_SUCCEEDED, done.reason

    addresses = [primary.address, backup.address]
    version, got = await final_weights(addresses, job.job_id, spec, "node-secret")
    assert version == spec.steps
    assert_bitwise_equal(got, want)
    async with open_channel(primary.address) as channel:  # no token
        request = paramserver.PullRequest(job_id=job.job_id, since_version=-1)
        with pytest.raises(grpc.RpcError) as refused:
            async for _ in ParamServerStub(channel).Pull(request, timeout=10):
                pass
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
