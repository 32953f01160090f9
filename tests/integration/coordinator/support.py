"""Helpers of the coordinator integration tests."""

from __future__ import annotations

import asyncio
import time

import grpc

from stalwart.api import common, coordinator, coordinator_grpc
from stalwart.channel import open_channel
from stalwart.errors import RpcError


async def status_of(
    address: str, timeout: float = 1.0
) -> coordinator.GetClusterStatusResponse | None:
    """One replica's own answer (no leader following); None if it does not answer."""
    async with open_channel(address) as channel:
        try:
            return await coordinator_grpc.CoordinatorServiceStub(channel).GetClusterStatus(
                coordinator.GetClusterStatusRequest(), timeout=timeout
            )
        except grpc.RpcError:
            return None


async def wait_leader(address: str, timeout: float = 15.0) -> coordinator.GetClusterStatusResponse:
    """Poll until the replica at ``address`` says it leads; returns its status."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = await status_of(address)
        if status is not None and status.is_leader:
            return status
        await asyncio.sleep(0.02)
    raise AssertionError(f"{address} did not become leader within {timeout}s")


async def call(address: str, method: str, request, timeout: float = 5.0):
    """One raw call to one replica; failures as RpcError."""
    async with open_channel(address) as channel:
        try:
            return await getattr(coordinator_grpc.CoordinatorServiceStub(channel), method)(
                request, timeout=timeout
            )
        except grpc.RpcError as exc:
            raise RpcError.from_grpc(exc) from None


def job_spec(**changes) -> coordinator.JobSpec:
    spec = coordinator.JobSpec(
        model="mlp", num_slots=2, steps=20, batch_size=8,
        optimizer=common.OptimizerSpec(kind=common.OPTIMIZER_KIND_SGD, lr=0.1),
    )  # fmt: skip
    for name, value in changes.items():
        target = spec.optimizer if name == "lr" else spec
        setattr(target, name, value)
    return spec
