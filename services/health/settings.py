"""Settings of the health service (flags, ``STALWART_*`` env, defaults)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from services.health.fleet import HealthConfig
from services.health.online import DEFAULT_DETECTOR, POINTWISE
from services.health.rules import RuleConfig
from stalwart.settings import ServiceSettings


class HealthSettings(ServiceSettings):
    coordinator: str = ""
    """Comma-separated host:port of the coordinator replicas to register with (role
    HEALTH), so `stalwart nodes` lists it; empty: run on its own."""

    advertise_address: str = ""
    """host:port others dial to reach this service; default: the bound address."""

    drain_threshold: float = Field(default=0.8, gt=0, le=1)
    """Risk at or above which an alert asks for the node to be drained."""

    window_samples: int = Field(default=120, ge=5)
    """Samples kept per node."""

    fit_samples: int = Field(default=200, ge=20)
    """Fleet samples the Isolation Forest is fitted on (the fleet's early telemetry)."""

    detector: Literal[POINTWISE] = DEFAULT_DETECTOR
    """Offline detector (services/health/detectors.py) fitted on the fleet's early
    telemetry, by the same code as `stalwart health eval`: isolation_forest, pca or
    threshold_rule (point-wise ones: pooled samples of many nodes are no time series)."""

    anomaly_every_seconds: float = Field(default=2.0, ge=0)
    """A node's anomaly score is recomputed at most this often (the rules: every sample)."""

    max_metrics: int = Field(default=256, ge=1)
    """Most metrics one sample may carry (RESOURCE_EXHAUSTED above)."""

    max_nodes: int = Field(default=10_000, ge=1)
    """Nodes tracked at once; a new node beyond it is refused (RESOURCE_EXHAUSTED)
    unless some tracked node has been silent for --forget-after-seconds."""

    forget_after_seconds: float = Field(default=600.0, gt=0)
    """A node silent this long is forgotten when a new one needs its place."""

    alerts_kept: int = Field(default=10_000, ge=10)
    """Recent alerts kept for ListAlerts."""

    alert_repeat_seconds: float = Field(default=30.0, ge=0)
    """One alert per node and kind at most this often."""

    temp_warn_celsius: float = 83.0
    """GPU temperature where thermal risk starts (0.5)."""

    temp_critical_celsius: float = 92.0
    """GPU temperature of risk 1."""

    straggler_factor: float = Field(default=3.0, gt=1)
    """Median step time this many times the peers' median means risk 0.8."""

    def health_config(self) -> HealthConfig:
        return HealthConfig(
            window_samples=self.window_samples,
            fit_samples=self.fit_samples,
            drain_threshold=self.drain_threshold,
            alert_repeat_seconds=self.alert_repeat_seconds,
            detector=self.detector,
            anomaly_every_seconds=self.anomaly_every_seconds,
            max_nodes=self.max_nodes,
            forget_after_seconds=self.forget_after_seconds,
            rules=RuleConfig(
                temp_warn_c=self.temp_warn_celsius,
                temp_critical_c=self.temp_critical_celsius,
                straggler_factor=self.straggler_factor,
            ),
        )

    def coordinator_list(self) -> list[str]:
        return [a.strip() for a in self.coordinator.split(",") if a.strip()]
