"""Discrete-event simulation of one training job on N GPUs: ETTR and effective throughput
per recovery strategy, driven by published failure data and our own measurements.

Pure code: no grpc, no torch. ``simulate(SimConfig(...), inputs.load(), fit)``.
"""

from stalwart.sim.inputs import InputError, Measured, load
from stalwart.sim.run import STRATEGIES, SimConfig, anchors, sensitivity, simulate
from stalwart.sim.trace import TraceMissing, load_fit

__all__ = [
    "STRATEGIES",
    "InputError",
    "Measured",
    "SimConfig",
    "TraceMissing",
    "anchors",
    "load",
    "load_fit",
    "sensitivity",
    "simulate",
]
