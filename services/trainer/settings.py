"""Settings of a trainer process (flags, ``STALWART_*`` env, defaults)."""

from __future__ import annotations

from pathlib import Path
from typing import Self

from pydantic import Field, field_validator, model_validator

from stalwart import devices
from stalwart.settings import ServiceSettings


class TrainerSettings(ServiceSettings):
    coordinator: str = ""
    """Comma-separated host:port of the coordinator replicas; the trainer takes its work
    from their heartbeat answers."""

    standby: bool = False
    """Register as a warm standby: hold the job's current weights, compute nothing
    until the coordinator hands over a slot."""

    assignment_file: Path | None = None
    """Test and offline mode: read one Assignment (protobuf JSON) from this file
    instead of asking a coordinator, train it to the end, then exit."""

    device: str = "auto"
    """Where gradients are computed: auto (a GPU when present, else the CPU), cpu,
    cuda (a GPU, required) or cuda:N. auto and cuda take GPU local_index modulo the
    GPUs visible (stalwart/devices.py). Bitwise equality holds between runs on the
    same kind of device."""

    local_index: int | None = Field(default=None, ge=0)
    """This trainer's position among the trainers of its machine, for one GPU per
    trainer; default: LOCAL_RANK from the environment (torchrun's), else 0."""

    torch_threads: int = Field(default=1, ge=1)
    """Intra-op threads; 1 keeps CPU reductions in one order (deterministic)."""

    faults: str = ""
    """TEST ONLY, empty (off) by default: fault injection keyed by step, e.g.
    "crash_at_step=7", "crash_after_push=7", "hang_at_step=7", "delay_s=0.5",
    "flip_bit_at_step=7", "heat_from_step=7" (see services/trainer/faults.py)."""

    health: str = ""
    """host:port of the health service to stream telemetry to; empty: none."""

    health_interval_seconds: float = Field(default=0.2, gt=0)
    """How often a telemetry sample goes to the health service."""

    advertise_address: str = ""
    """host:port the coordinator lists for this trainer (RegisterNode); default: the bound
    address, which is no use to others when the bind host is 0.0.0.0."""

    call_timeout_seconds: float = Field(default=30.0, gt=0)
    """Deadline of one paramserver call (a sync push waits for every slot)."""

    retry_seconds: float = Field(default=60.0, gt=0)
    """How long the paramserver SDK retries one call through failover."""

    poll_seconds: float = Field(default=5.0, gt=0)
    """Longest single wait for new weights before looking at the assignment again."""

    @field_validator("device")
    @classmethod
    def _device_parses(cls, value: str) -> str:
        return str(devices.parse(value))  # DeviceError is a ValueError: a settings error

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if bool(self.coordinator) == bool(self.assignment_file):
            raise ValueError("give exactly one of --coordinator and --assignment-file")
        return self

    def coordinator_list(self) -> list[str]:
        return [a.strip() for a in self.coordinator.split(",") if a.strip()]
