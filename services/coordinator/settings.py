"""Settings of a coordinator replica (flags, ``STALWART_*`` env, defaults)."""

from __future__ import annotations

from typing import Self

from pydantic import Field, field_validator, model_validator

from services.coordinator.detector import DetectorConfig
from services.coordinator.statestore import check_prefix
from stalwart.settings import ServiceSettings


class CoordinatorSettings(ServiceSettings):
    store_url: str = "shm:///dev/shm/stalwart"
    """Coordination store shared by every coordinator replica (shm://, redis://, ignite://)."""

    store_prefix: str = ""
    """Key prefix in the store, so several clusters can share one store (at most 181
    characters of A-Z a-z 0-9 . _ : @ = + - /: statestore.MAX_PREFIX_CHARS)."""

    advertise_address: str = ""
    """host:port other processes dial to reach this replica; default: the bound address."""

    leader_ttl_seconds: float = Field(default=3.0, gt=0)
    """TTL of the leader lease: a leader that cannot renew for this long (less the
    margin) stops acting, and a paused leader, or on redis:// and ignite:// a dead
    one, is replaced about this long after (shm:// sees a dead holder at once)."""

    leader_renew_seconds: float = Field(default=0.25, gt=0)
    """How often the leader renews its lease."""

    leader_poll_seconds: float = Field(default=0.1, gt=0)
    """How often a standby tries to take the lease."""

    leader_margin_seconds: float = Field(default=0.2, ge=0)
    """The leader stops acting this long before its lease could lapse in the store."""

    node_lease_seconds: float = Field(default=3.0, gt=0)
    """Floor of failure detection: no node is declared dead for a silence shorter than
    this (granted on registration and after a leader change). Above it the accrual
    detector decides from the node's own beat intervals (docs/control-plane.md)."""

    node_phi_threshold: float = Field(default=8.0, gt=0)
    """Suspicion (phi) at which a silent node is declared dead: its silence is this
    unlikely, -log10 of the probability, given the intervals its beats arrived at."""

    node_dead_max_seconds: float = Field(default=30.0, gt=0)
    """Ceiling of failure detection: a node silent this long is dead whatever its history
    (never below node_lease_seconds: a longer floor raises it)."""

    forget_dead_after_seconds: float = Field(default=3600.0, gt=0)
    """A node dead this long (since its lease ended) that no live job or shard group
    names is removed from the membership and the store, so processes replaced under
    new ids (pods of a Deployment) do not pile up in every tick and listing."""

    heartbeat_interval_seconds: float = Field(default=0.2, gt=0)
    """Beat interval nodes are told to keep."""

    tick_seconds: float = Field(default=0.1, gt=0)
    """Period of the leader's control loop (lease expiry, placement)."""

    paramserver_poll_seconds: float = Field(default=0.1, gt=0)
    """How often the leader polls GetReplicaStatus of every paramserver."""

    paramserver_unreachable_polls: int = Field(default=3, ge=0)
    """Consecutive refused polls after which a paramserver is declared dead before its
    lease ends (it has no process listening any more); 0 waits for the lease."""

    paramserver_backups: int = Field(default=0, ge=0)
    """Backups each shard group's primary replicates to. Further live replicas of the
    group are warm spares: one is installed as backup in the place of a backup that
    died or stopped answering polls. 0: every live replica is a backup."""

    request_retention_seconds: float = Field(default=24 * 3600.0, gt=0)
    """How long a mutating call's request id is remembered: a retry within it gets the
    first call's answer; after it, the id and its answer are deleted from the store."""

    store_timeout_seconds: float = Field(default=2.0, gt=0)
    """Longest one store operation may take before it counts as failed."""

    max_slots: int = Field(default=1024, ge=1)
    """Most slots one job may ask for."""

    max_steps: int = Field(default=10**9, ge=1)
    """Most steps one job may ask for."""

    max_live_jobs: int = Field(default=1000, ge=1)
    """Most jobs pending or running at once; CreateJob beyond it is refused
    (RESOURCE_EXHAUSTED) until one ends. Every live job costs the leader work on each
    tick and each admission, so an unbounded queue would slow its heartbeats."""

    keep_finished_jobs: int = Field(default=10_000, ge=100)
    """Finished jobs the leader keeps listed (ListJobs, GetJob, the store): those that
    ended last. Older ones are forgotten, as Kubernetes garbage-collects terminated pods
    past a threshold, so a client creating and cancelling jobs in a loop cannot grow the
    leader's memory, its listings and a new leader's load without end. A finished job
    with checkpoints in the store is never forgotten: exporting one reads its spec."""

    keep_finished_models: int = Field(default=8, ge=0)
    """Finished jobs whose models (weights, optimizer state) the paramservers keep for
    `stalwart job export`: those that ended last. Older ones are deleted from every
    replica (export them from a checkpoint), so job after job cannot fill memory."""

    events_kept: int = Field(default=10_000, ge=100)
    """Events kept in the store for WatchEvents replay."""

    lease_url: str = ""
    """Where the leader lease is held, when not in store_url: ``k8s://namespace/prefix``
    (a coordination.k8s.io Lease, stalwart/stores/k8s_lease.py) or any store URL. Its
    fencing token is the coordinator epoch, so keep one lease backend for the life of a
    state store (another one would start counting epochs from 1 again)."""

    checkpoint_url: str = ""
    """Store of the jobs' checkpoints (chunks and manifests: the catalog); default: store_url."""

    durable_url: str = ""
    """Durable tier (file://...) that every ``durable_every``-th checkpoint of a job is
    copied to; empty turns tiering off."""

    durable_every: int = Field(default=4, ge=1)
    """Copy every K-th checkpoint of a job to ``durable_url``."""

    keep_checkpoints: int = Field(default=3, ge=1)
    """Checkpoints kept per job; older ones and the chunks only they use are deleted."""

    checkpoint_gc_seconds: float = Field(default=600.0, ge=0)
    """How often the leader sweeps the checkpoint store of chunks no manifest names
    (uploads that never published: replicas that disagreed, a shard that failed, a
    leader lost mid-save), while no checkpoint of its own is being taken. 0: never."""

    hung_step_seconds: float = Field(default=300.0, ge=0)
    """A synchronous job's step that stands still this long (or ten of its slowest
    trainer's steps, if longer) while some of its slots' pushes are missing: their
    trainers are drained as hung, and a standby or another trainer takes the slots.
    With every push in and no commit, the primary is wedged: its group fails over
    to a backup. 0 turns both off (services/coordinator/hangwatch.py)."""

    checkpoint_timeout_seconds: float = Field(default=120.0, gt=0)
    """Longest one checkpoint (every shard's snapshot and upload) or restore may take."""

    health: str = ""
    """host:port of the health service: watch its alerts (drain nodes expected to fail),
    read node risks for placement, send it corruption alerts. Empty: none."""

    health_drain_risk: float = Field(default=0.8, gt=0, le=1)
    """A trainer whose health risk reaches this is drained (its slot moves to a standby)."""

    health_poll_seconds: float = Field(default=1.0, gt=0)
    """How often node risks are read from the health service."""

    duplicate_check_timeout_seconds: float = Field(default=10.0, gt=0)
    """A trainer asked to recompute a sampled batch that has not answered by then is
    replaced by another; when all were too slow they are asked again (a sampled batch
    is never pushed unverified for slowness; only with no other trainer at all)."""

    @property
    def checkpoint_store_url(self) -> str:
        return self.checkpoint_url or self.store_url

    @field_validator("store_prefix")
    @classmethod
    def _check_prefix(cls, value: str) -> str:
        return check_prefix(value)

    @model_validator(mode="after")
    def _check_timings(self) -> Self:
        if self.leader_renew_seconds + self.leader_margin_seconds >= self.leader_ttl_seconds:
            raise ValueError(
                "leader_renew_seconds + leader_margin_seconds must be < leader_ttl_seconds"
            )
        if self.heartbeat_interval_seconds >= self.node_lease_seconds:
            raise ValueError("heartbeat_interval_seconds must be < node_lease_seconds")
        return self

    def detector(self) -> DetectorConfig:
        """The failure detector's configuration (services/coordinator/detector.py)."""
        return DetectorConfig(
            interval_s=self.heartbeat_interval_seconds,
            floor_s=self.node_lease_seconds,
            ceiling_s=max(self.node_dead_max_seconds, self.node_lease_seconds),
            threshold=self.node_phi_threshold,
        )
