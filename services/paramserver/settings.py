"""Settings of a paramserver replica (flags, ``STALWART_*`` env, defaults)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from stalwart.settings import ServiceSettings


class ParamServerSettings(ServiceSettings):
    role: Literal["primary", "backup"] = "primary"
    """Role at start-up. A restarted replica should start as backup and be caught up."""

    epoch: int = Field(default=1, ge=0)
    """Epoch at start-up; a promotion raises it. Requests from lower epochs are refused."""

    backups: str = ""
    """Comma-separated host:port of the backups a primary replicates to."""

    shard: int = Field(default=0, ge=0)
    """Index of the shard group this replica serves."""

    min_insync: int = Field(default=1, ge=0)
    """Backups that must apply an update before the push is acknowledged (capped by
    the number configured). 0 trades durability for availability."""

    backup_ack_seconds: float = Field(default=1.0, gt=0)
    """Longest a primary waits for a backup to take a forwarded push or acknowledge a
    commit; a backup that does not drops out of sync (it is re-installed once it
    answers again), so one hung backup does not stall every step."""

    unary_replication: bool = False
    """Replicate with one call per forwarded push and per commit, never on the
    long-lived replication stream (services/paramserver/replstream.py); for
    comparisons and as a way out should the stream misbehave."""

    sync_wait_seconds: float = Field(default=60.0, gt=0)
    """Longest a sync push waits for the other slots when the call has no deadline."""

    torch_threads: int = Field(default=1, ge=1)
    """Threads torch may use for the optimizer; elementwise work is memory-bound."""

    max_stream_bytes: int = Field(default=4 << 30, ge=1)
    """Largest tensor payload one stream may carry."""

    max_tensor_elements: int = Field(default=1 << 31, ge=1)
    """Largest element count of one tensor."""

    memory_budget_bytes: int = Field(default=0, ge=0)
    """Most bytes the jobs on this replica may hold (parameters, optimizer state, a
    step's buffers); RegisterModel of a model that would go past it is refused
    LIMIT_EXCEEDED. 0: the memory the machine or container has available when the
    model arrives, so a model too large is refused instead of the kernel's OOM
    killer ending the process and every job it holds."""

    coordinator: str = ""
    """Comma-separated host:port of the coordinator replicas to register with and
    heartbeat to; empty runs the replica standalone (configured by its flags only)."""

    advertise_address: str = ""
    """host:port the coordinator, trainers and the other replicas dial to reach this one
    (registered with the coordinator); default: the bound address, which is no use to
    others when the bind host is 0.0.0.0."""

    faults: str = ""
    """Test-only fault injection, e.g. "flip_state_at_version=7" (see
    services/paramserver/faults.py). Never set it outside tests."""

    def backup_list(self) -> list[str]:
        return [b.strip() for b in self.backups.split(",") if b.strip()]
