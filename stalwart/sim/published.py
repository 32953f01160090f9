"""Published failure figures the simulator is driven by, as data with their sources.

Each cause carries how it shows itself to the training job, which decides what each
strategy has to do about it (see :mod:`stalwart.sim.failures`):

- ``manifest``: ``crash`` (a process or host dies: a refused connection or a lost
  heartbeat says so quickly), ``hang`` (a link or a device stops answering: only a
  timeout says so), ``silent`` (wrong numbers, no error: silent data corruption).
- ``scope``: ``node`` (one host's hardware or software; the rest of the job is fine)
  or ``job`` (a software bug or a dependency that takes down every rank).
- ``precursor``: the hardware kinds whose failures can show degradation ahead of time
  (ECC counts, temperatures, optical power, link flaps); only these can be predicted.
  How many of them actually do is a parameter (``precursor_share``), not published.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Cause:
    name: str
    count: int
    manifest: str  # crash | hang | silent
    scope: str  # node | job
    precursor: bool


# The Llama 3 Herd of Models (Meta, arXiv:2407.21783, July 2024), section 3.3.4, Table 5:
# root causes of the 419 unexpected interruptions during a 54-day snapshot of Llama 3 405B
# pre-training on 16,384 H100 GPUs (466 interruptions in all; 47 were planned).
# The paper prints 30.1% for "faulty GPU" although 148/419 is 35.3% (its percentages sum to
# 94.9%); we use the counts.
LLAMA3_SOURCE = "Llama 3 Herd of Models, arXiv:2407.21783, sec. 3.3.4, Table 5"
LLAMA3_GPUS = 16_384
LLAMA3_DAYS = 54
LLAMA3_PLANNED = 47
LLAMA3_EFFECTIVE_TRAINING_TIME = 0.90  # "higher than 90% effective training time"
LLAMA3_CAUSES = (
    Cause("faulty GPU", 148, "crash", "node", True),
    Cause("GPU HBM3 memory", 72, "crash", "node", True),
    Cause("software bug", 54, "crash", "job", False),
    Cause("network switch/cable", 35, "hang", "node", True),
    Cause("host maintenance (unplanned)", 32, "crash", "node", False),
    Cause("GPU SRAM memory", 19, "crash", "node", True),
    Cause("GPU system processor", 17, "crash", "node", False),
    Cause("NIC", 7, "hang", "node", True),
    Cause("NCCL watchdog timeouts", 7, "hang", "node", False),
    Cause("silent data corruption", 6, "silent", "node", False),
    Cause("GPU thermal interface + sensor", 6, "crash", "node", True),
    Cause("SSD", 3, "crash", "node", True),
    Cause("power supply", 3, "crash", "node", True),
    Cause("server chassis", 2, "crash", "node", False),
    Cause("IO expansion board", 2, "crash", "node", False),
    Cause("dependency", 2, "crash", "job", False),
    Cause("CPU", 2, "crash", "node", False),
    Cause("system memory", 2, "crash", "node", True),
)
assert sum(c.count for c in LLAMA3_CAUSES) == 419

# Kokolis et al., "Revisiting Reliability in Large-Scale Machine Learning Research Clusters"
# (Meta FAIR, arXiv:2410.21680, HPCA 2025): failures per node (8 A100) per day on RSC-1,
# the 16k-GPU research cluster, and the MTTF the paper projects from it for large jobs.
META_SOURCE = "Kokolis et al., arXiv:2410.21680 (HPCA 2025), RSC-1"
META_FAILURES_PER_1000_NODE_DAYS = 6.50
META_MTTF_PROJECTED_H = {
    16_384: 1.8,
    131_072: 0.23,
}  # GPUs -> hours; our rate model reproduces these

# Robust LLM Training Infrastructure at ByteDance (ByteRobust, arXiv:2509.16293, SOSP 2025):
# 97% ETTR for a three-month training job on 9,600 GPUs.
BYTEROBUST_SOURCE = "ByteRobust, arXiv:2509.16293"
BYTEROBUST_GPUS = 9_600
BYTEROBUST_DAYS = 90
BYTEROBUST_ETTR = 0.97

# How the InfiniteHBD trace's classes show themselves (same meaning as above). Classes not
# listed are node-scope crashes without a precursor.
TRACE_CLASS_KIND = {
    ("Hardware Failure", "GPU"): ("crash", "node", True),
    ("Hardware Failure", "Parameter Plane Cable"): ("hang", "node", True),
    ("Hardware Failure", "NIC"): ("hang", "node", True),
    ("Hardware Failure", "Fan"): ("crash", "node", True),
    ("Hardware Failure", "Power Supply"): ("crash", "node", True),
}
# The trace's software failures are a node's own (file system, kubelet, kernel panic):
# node-scope crashes like the unlisted classes. It holds no job-wide software bugs.
TRACE_SILENT_DESC = "Silent Data Corruption"
# Rows of the trace that are operations on a node, not faults a job would meet.
TRACE_NOT_FAULTS = {("Other Failure", "Stress Test Failure"), ("Other Failure", "Change"),
                    ("Other Failure", "Test")}  # fmt: skip
TRACE_GPUS_PER_SERVER = 8
