"""What a trainer reports with each heartbeat: its steps, and the health of its hardware.

Step metrics come from the training loop. Hardware metrics come from NVML
(``nvidia-ml-py``, an optional dependency: ``pip install .[gpu]``) when a GPU is
in use, else from psutil. Names follow the Prometheus base-unit convention the
health service reads (``step_time_seconds``, ``gpu_temperature_celsius`` ...).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import psutil

from services.trainer import metrics as prom  # StepStats has a metrics() of its own
from stalwart import log

try:  # optional: only machines with NVIDIA GPUs need it
    import pynvml
except ImportError:  # pragma: no cover - depends on the machine
    pynvml = None


@dataclass
class StepStats:
    """The latest finished step, as the loop recorded it."""

    step: int = -1
    step_time_seconds: float = 0.0
    loss: float = 0.0
    grad_norm: float = 0.0
    samples_per_second: float = 0.0
    steps_total: int = 0

    def record(self, step: int, seconds: float, loss: float, grad_norm: float, samples: int):
        self.step = step
        self.step_time_seconds = seconds
        self.loss = loss
        self.grad_norm = grad_norm
        self.samples_per_second = samples / seconds if seconds > 0 else 0.0
        self.steps_total += 1
        prom.step_recorded(seconds, loss, samples)

    def metrics(self) -> dict[str, float]:
        if self.steps_total == 0:
            return {}
        return {
            "step_time_seconds": self.step_time_seconds,
            "loss": self.loss,
            "grad_norm": self.grad_norm,
            "samples_per_second": self.samples_per_second,
            "steps_total": float(self.steps_total),
        }


class _Gpu:
    """NVML readings of one device; any reading a GPU does not support is skipped."""

    def __init__(self, index: int):
        pynvml.nvmlInit()
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)

    def read(self) -> dict[str, float]:
        nv, h, out = pynvml, self.handle, {}
        readers = {
            "gpu_utilization_percent": lambda: nv.nvmlDeviceGetUtilizationRates(h).gpu,
            "gpu_memory_used_bytes": lambda: nv.nvmlDeviceGetMemoryInfo(h).used,
            "gpu_memory_total_bytes": lambda: nv.nvmlDeviceGetMemoryInfo(h).total,
            "gpu_temperature_celsius": lambda: nv.nvmlDeviceGetTemperature(
                h, nv.NVML_TEMPERATURE_GPU
            ),
            "gpu_power_watts": lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "gpu_ecc_errors_total": lambda: nv.nvmlDeviceGetTotalEccErrors(
                h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC
            ),
        }
        for name, read in readers.items():
            try:
                out[name] = float(read())
            except pynvml.NVMLError:
                continue  # not supported on this GPU (ECC on consumer cards, say)
        return out


class Telemetry:
    """Builds the metrics map sent with every heartbeat."""

    def __init__(self, device: str, stats: StepStats):
        self.stats = stats
        self._process = psutil.Process(os.getpid())
        self._process.cpu_percent(None)  # first call primes the counter
        self._gpu = self._open_gpu(device)

    @staticmethod
    def _open_gpu(device: str) -> _Gpu | None:
        if pynvml is None or not device.startswith("cuda"):
            return None
        index = int(device.partition(":")[2] or 0)
        try:
            return _Gpu(index)
        except Exception as exc:  # NVML missing or refusing: report CPU metrics only
            log.get_logger(__name__).warning("NVML unavailable", error=str(exc))
            return None

    def sample(self) -> dict[str, float]:
        out = self.stats.metrics()
        if self._gpu is not None:
            out.update(self._gpu.read())
        out["cpu_percent"] = self._process.cpu_percent(None)
        out["memory_rss_bytes"] = float(self._process.memory_info().rss)
        out["system_memory_percent"] = psutil.virtual_memory().percent
        return out
