"""The job being simulated, and the models of what grows with its size N.

Every model here is a documented assumption (docs/scale.md, "Scaling models"): the
constants are named, the shapes are the usual ones (a tree for rendezvous and failure
detection, a shared storage pipe for checkpoints, a peer-to-peer copy for live recovery).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Workload:
    """One data-parallel training job; the default is Llama 3 405B's shape."""

    gpus: int
    gpus_per_node: int = 8
    replica_gpus: int = 128  # one data-parallel replica: tensor x pipeline parallel (8 x 16)
    params: float = 405e9
    state_bytes_per_param: float = 16.0  # bf16 weights + fp32 master weights + 2 Adam moments
    step_s_at_16k: float = 6.0  # fixed global batch: the step time scales as 16,384 / N
    storage_bytes_per_s: float = 2e12  # shared checkpoint storage (Llama 3: 2 TB/s sustained)
    node_io_bytes_per_s: float = 2.5e9  # one node's share of the storage path
    peer_bytes_per_s: float = 50e9  # node-to-node copy (400 Gb/s NIC)

    @property
    def nodes(self) -> int:
        return max(1, self.gpus // self.gpus_per_node)

    @property
    def replicas(self) -> int:
        return max(1, self.gpus // self.replica_gpus)

    @property
    def replica_nodes(self) -> int:
        return max(1, self.replica_gpus // self.gpus_per_node)

    @property
    def step_s(self) -> float:
        return self.step_s_at_16k * 16_384 / self.gpus

    @property
    def state_bytes(self) -> float:
        return self.params * self.state_bytes_per_param

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__} | {
            "nodes": self.nodes, "replicas": self.replicas, "step_s": round(self.step_s, 3)}  # fmt: skip


# Rendezvous and collective init: a tree over the nodes, RDZV_BASE_S + RDZV_PER_LEVEL_S per
# doubling. With these, 16,384 GPUs (2,048 nodes) take 120 s.
RDZV_BASE_S = 10.0
RDZV_PER_LEVEL_S = 10.0
# Failure detection through an aggregation tree of fan-out DETECT_FANOUT: one hop per level.
DETECT_FANOUT = 64
DETECT_HOP_S = 0.25
# Registering a whole job's trainers with the coordinator (Stalwart job restart).
COORD_REGISTRATIONS_PER_S = 500.0


def rendezvous_s(nodes: int) -> float:
    return RDZV_BASE_S + RDZV_PER_LEVEL_S * math.log2(max(2, nodes))


def checkpoint_s(w: Workload) -> float:
    """Write (or read) the whole training state through shared storage: limited by the
    storage pipe, or by the nodes' own links when the job is small."""
    bandwidth = min(w.storage_bytes_per_s, w.nodes * w.node_io_bytes_per_s)
    return w.state_bytes / bandwidth


def detection_s(measured_s: float, nodes: int) -> float:
    """Our measured detection on one host, plus one aggregation hop per tree level."""
    levels = math.ceil(math.log(max(2, nodes), DETECT_FANOUT))
    return measured_s + DETECT_HOP_S * max(0, levels - 1)


def group_init_s(w: Workload) -> float:
    """Re-form one replica's collectives after a node in it was swapped."""
    return rendezvous_s(w.replica_nodes) * 0.5


def live_recovery_s(w: Workload) -> float:
    """A restarted replica copies the training state from a healthy peer replica, node to node."""
    return w.state_bytes / (w.replica_nodes * w.peer_bytes_per_s)


def stalwart_job_restart_s(w: Workload, base_s: float) -> float:
    """Every trainer restarts: processes (our small-scale restart), registration with the
    coordinator, replica collectives, then a pull of the weights from the paramservers."""
    pull_s = w.params * 2 / (w.replica_nodes * w.peer_bytes_per_s)
    return base_s + w.nodes / COORD_REGISTRATIONS_PER_S + group_init_s(w) + pull_s
