"""Between the decision code's plain objects and the wire messages (stalwart.v1)."""

from __future__ import annotations

import math
from collections.abc import Collection

from google.protobuf.timestamp_pb2 import Timestamp

from services.coordinator.jobs import (
    Cancelled,
    Failed,
    Job,
    JobState,
    Pending,
    Running,
    Slot,
    Status,
    Succeeded,
)
from services.coordinator.membership import NodeRecord, NodeState, Role
from stalwart.api import common, coordinator

JOB_STATES = {
    JobState.PENDING: coordinator.JOB_STATE_PENDING,
    JobState.RUNNING: coordinator.JOB_STATE_RUNNING,
    JobState.SUCCEEDED: coordinator.JOB_STATE_SUCCEEDED,
    JobState.FAILED: coordinator.JOB_STATE_FAILED,
    JobState.CANCELLED: coordinator.JOB_STATE_CANCELLED,
}
JOB_STATES_BACK = {v: k for k, v in JOB_STATES.items()}

NODE_STATES = {
    NodeState.ALIVE: coordinator.NODE_STATE_ALIVE,
    NodeState.DRAINING: coordinator.NODE_STATE_DRAINING,
    NodeState.DRAINED: coordinator.NODE_STATE_DRAINED,
    NodeState.DEAD: coordinator.NODE_STATE_DEAD,
    NodeState.QUARANTINED: coordinator.NODE_STATE_QUARANTINED,
}
NODE_STATES_BACK = {v: k for k, v in NODE_STATES.items()}

ROLES = {
    Role.COORDINATOR: common.NODE_ROLE_COORDINATOR,
    Role.PARAMSERVER: common.NODE_ROLE_PARAMSERVER,
    Role.TRAINER: common.NODE_ROLE_TRAINER,
    Role.HEALTH: common.NODE_ROLE_HEALTH,
    Role.AGENT: common.NODE_ROLE_AGENT,
}
ROLES_BACK = {v: k for k, v in ROLES.items()}

REPLICA_ROLES = {
    "primary": common.REPLICA_ROLE_PRIMARY,
    "backup": common.REPLICA_ROLE_BACKUP,
    "fenced": common.REPLICA_ROLE_FENCED,
    "": common.REPLICA_ROLE_UNSPECIFIED,
}
REPLICA_ROLES_BACK = {v: k for k, v in REPLICA_ROLES.items()}


def timestamp(seconds: float) -> Timestamp:
    """``seconds`` to the nearest nanosecond, which :func:`seconds` reads back as the same
    float. Through one integer of nanoseconds (1.8e18 today, past float's 2^53) the
    round trip moved a time by up to an ulp: a new leader's job times sorted apart
    from its predecessor's, and a ListJobs page token repeated the boundary job."""
    whole = math.floor(seconds)
    nanos = round((seconds - whole) * 1e9)  # the subtraction is exact
    ts = Timestamp()
    ts.FromNanoseconds(whole * 1_000_000_000 + nanos)
    return ts


def seconds(ts: Timestamp) -> float:
    return ts.seconds + ts.nanos / 1e9


# --- jobs ------------------------------------------------------------------------------


def job_to_proto(job: Job, lost_groups: Collection[int] = ()) -> coordinator.Job:
    """``lost_groups``: shard groups that lost every replica (a restore pending), named
    in a running job's reason; the state store is written without them."""
    return coordinator.Job(
        job_id=job.job_id,
        spec=job.spec,
        state=JOB_STATES[job.state],
        reason=shown_reason(job, lost_groups),
        step=job.step,
        slots=[
            coordinator.SlotAssignment(slot=s.index, node_id=s.node_id, step=job.step)
            for s in job.slots
        ],
        create_time=timestamp(job.created_at),
        update_time=timestamp(job.updated_at),
    )


def shown_reason(job: Job, lost_groups: Collection[int]) -> str:
    """The job's reason, or for a running job that waits for a lost shard group to be
    restored, what it waits for: its step stands still meanwhile, with nothing else
    to say why."""
    lost = sorted(k for k in lost_groups if 0 <= k < job.num_shards)
    if job.state is not JobState.RUNNING or not lost:
        return job.status.reason
    groups = ", ".join(map(str, lost))
    return (
        f"waiting: every replica of shard group {groups} lost; the job resumes once "
        "a new paramserver of the group holds it, restored from its last checkpoint"
    )


def job_from_proto(msg: coordinator.Job) -> Job:
    created, updated = seconds(msg.create_time), seconds(msg.update_time)
    spec = coordinator.JobSpec()
    spec.CopyFrom(msg.spec)
    return Job(
        job_id=msg.job_id,
        num_slots=spec.num_slots,
        steps=spec.steps,
        created_at=created,
        spec=spec,
        num_shards=max(1, spec.num_shards),
        status=_status(JOB_STATES_BACK[msg.state], msg.reason, created, updated, msg.step),
        step=msg.step,
        slots=[Slot(s.slot, s.node_id) for s in msg.slots],
        updated_at=updated,
    )


def _status(state: JobState, reason: str, created: float, updated: float, step: int) -> Status:
    match state:
        case JobState.PENDING:
            return Pending(created)
        case JobState.RUNNING:
            return Running(updated)
        case JobState.SUCCEEDED:
            return Succeeded(updated, step)
        case JobState.FAILED:
            return Failed(updated, reason)
    return Cancelled(updated, reason)


# --- nodes -----------------------------------------------------------------------------


def node_to_proto(
    node: NodeRecord, job_id: str = "", slots: tuple[int, ...] = ()
) -> coordinator.Node:
    """The wire Node; ``job_id``/``slots`` say what it holds (no slot: none, or a standby
    place). ``slot`` is the first of them, -1 for none."""
    return coordinator.Node(
        node_id=node.node_id,
        role=ROLES[node.role],
        address=node.address,
        state=NODE_STATES[node.state],
        health_score=node.health_score,
        lease_expire_time=timestamp(node.lease_expires),
        labels=node.labels,
        standby=node.standby,
        job_id=job_id,
        slot=slots[0] if slots else -1,
        slots=slots,
        step_time_ema_seconds=node.step_time_ema,
        shard=node.shard,
        replica_role=REPLICA_ROLES[node.replica_role],
    )


def node_from_proto(msg: coordinator.Node) -> NodeRecord:
    return NodeRecord(
        node_id=msg.node_id,
        role=ROLES_BACK[msg.role],
        address=msg.address,
        state=NODE_STATES_BACK[msg.state],
        lease_expires=seconds(msg.lease_expire_time),
        standby=msg.standby,
        labels=dict(msg.labels),
        shard=msg.shard,
        health_score=msg.health_score,
        step_time_ema=msg.step_time_ema_seconds,
        replica_role=REPLICA_ROLES_BACK.get(msg.replica_role, ""),
    )
