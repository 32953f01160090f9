"""The trainer's Prometheus series (deploy/grafana/metrics.txt), defined once.

Updated by :meth:`services.trainer.telemetry.StepStats.record`, the one place a
finished step (pulled, computed, pushed and acknowledged) is recorded, so the
dashboard and the heartbeat telemetry always describe the same steps.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

SAMPLES = Counter(
    "stalwart_trainer_samples_total",
    "Training samples in the steps this trainer computed and pushed (throughput = rate).",
)
STEPS = Counter("stalwart_trainer_steps_total", "Steps this trainer computed and pushed.")
STEP_SECONDS = Histogram(
    "stalwart_trainer_step_seconds",
    "Wall time of one step: pull, compute, push until acknowledged.",
    # CPU toy models step in milliseconds, real models on a GPU in seconds.
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
LOSS = Gauge("stalwart_trainer_loss", "Loss of the last computed batch.")


def step_recorded(seconds: float, loss: float, samples: int) -> None:
    SAMPLES.inc(samples)
    STEPS.inc()
    STEP_SECONDS.observe(seconds)
    LOSS.set(loss)
