"""Bearer-token roles: which caller may call which RPC.

Three roles, each including the one below it: ``admin`` (operators and the
coordinator acting on the cluster: submit, cancel, drain, failover, restore),
``node`` (trainers, paramservers, health agents: register, heartbeat, push,
pull, telemetry, replication) and ``viewer`` (read-only status, lists, watches).

The decision is a pure function (:func:`authorize`) over :data:`METHOD_ROLES`;
the server (:mod:`stalwart.instrument`) only reads the header and answers. With no token configured
the check is off, and the server log says so once.

Decisions written down here:
- Promote, ConfigureReplica and DeleteModel change who is primary or drop
  state, so they are admin calls: the coordinator holds the admin token when it
  drives paramservers, and a leaked node token cannot start a failover.
- VerifyCheckpoint reads every chunk of a checkpoint; it is admin so that a
  read-only viewer cannot load the store at will.
- A method missing from the table needs admin (fail closed);
  a unit test keeps the table equal to the protos.
"""

from __future__ import annotations

import enum
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from stalwart import log

AUTH_HEADER = "authorization"
_BEARER = "bearer "


class Role(enum.IntEnum):
    """Ordered: a role may call whatever a lower role may."""

    VIEWER = 1
    NODE = 2
    ADMIN = 3


_C = "/stalwart.v1.CoordinatorService/"
_P = "/stalwart.v1.ParamServerService/"
_T = "/stalwart.v1.TrainerService/"
_H = "/stalwart.v1.HealthMonitorService/"

METHOD_ROLES: Mapping[str, Role] = {
    # Coordinator
    _C + "CreateJob": Role.ADMIN,
    _C + "GetJob": Role.VIEWER,
    _C + "ListJobs": Role.VIEWER,
    _C + "CancelJob": Role.ADMIN,
    _C + "RegisterNode": Role.NODE,
    _C + "Heartbeat": Role.NODE,
    _C + "ListNodes": Role.VIEWER,
    _C + "DrainNode": Role.ADMIN,
    _C + "UndrainNode": Role.ADMIN,
    _C + "GetShardMap": Role.VIEWER,
    _C + "GetClusterStatus": Role.VIEWER,
    _C + "StepDown": Role.ADMIN,
    _C + "WatchEvents": Role.VIEWER,
    _C + "ListCheckpoints": Role.VIEWER,
    _C + "GetCheckpoint": Role.VIEWER,
    _C + "CreateCheckpoint": Role.ADMIN,
    _C + "VerifyCheckpoint": Role.ADMIN,
    _C + "RestoreCheckpoint": Role.ADMIN,
    _C + "DeleteCheckpoint": Role.ADMIN,
    _C + "ReportGradient": Role.NODE,
    _C + "ReportCorruption": Role.NODE,
    _C + "ReportTaskError": Role.NODE,
    # Parameter server
    _P + "RegisterModel": Role.NODE,
    _P + "Push": Role.NODE,
    _P + "PushStream": Role.NODE,
    _P + "Pull": Role.NODE,
    _P + "GetFingerprint": Role.VIEWER,
    _P + "GetReplicaStatus": Role.VIEWER,
    _P + "Promote": Role.ADMIN,
    _P + "ConfigureReplica": Role.ADMIN,
    _P + "DeleteModel": Role.ADMIN,
    _P + "ReplicatePush": Role.NODE,
    _P + "ReplicateCommit": Role.NODE,
    _P + "ReplicateStream": Role.NODE,
    _P + "InstallState": Role.NODE,
    _P + "RecordEvaluation": Role.NODE,
    _P + "ListJobMetrics": Role.VIEWER,
    # the coordinator drives checkpoints, as it drives promotion
    _P + "SaveCheckpoint": Role.ADMIN,
    _P + "LoadCheckpoint": Role.ADMIN,
    # Trainer
    _T + "GetTrainerStatus": Role.VIEWER,
    _T + "StopTrainer": Role.ADMIN,
    # Health monitor
    _H + "StreamTelemetry": Role.NODE,
    _H + "GetNodeRisk": Role.VIEWER,
    _H + "ListNodeRisks": Role.VIEWER,
    _H + "ListAlerts": Role.VIEWER,
    _H + "WatchAlerts": Role.VIEWER,
    _H + "RaiseAlert": Role.NODE,
}

# Probes and tooling must work without a token (kubelet, grpcurl, load balancers).
OPEN_SERVICES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)


@dataclass(frozen=True)
class Decision:
    """Outcome of a check: ``code`` is None when the call may proceed."""

    code: grpc.StatusCode | None
    message: str = ""
    role: Role | None = None

    @property
    def allowed(self) -> bool:
        return self.code is None


def required_role(method: str) -> Role | None:
    """Role needed for a fully-qualified method; None for always-open services."""
    if method.startswith(OPEN_SERVICES):
        return None
    return METHOD_ROLES.get(method, Role.ADMIN)


def role_of(token: str, tokens: Mapping[Role, str]) -> Role | None:
    """The role whose configured token equals ``token`` (constant-time compare)."""
    found = None
    for role, expected in tokens.items():
        # Compare against every role so timing does not reveal which one matched.
        if expected and hmac.compare_digest(token.encode(), expected.encode()):
            found = role
    return found


def authorize(method: str, token: str | None, tokens: Mapping[Role, str]) -> Decision:
    """Decide one call. ``tokens`` maps roles to configured tokens; none set = auth off."""
    needed = required_role(method)
    if needed is None or not any(tokens.values()):
        return Decision(None)
    if not token:
        return Decision(grpc.StatusCode.UNAUTHENTICATED, "missing bearer token")
    role = role_of(token, tokens)
    if role is None:
        return Decision(grpc.StatusCode.UNAUTHENTICATED, "invalid bearer token")
    if role < needed:
        message = f"role {role.name.lower()} may not call {method}; needs {needed.name.lower()}"
        return Decision(grpc.StatusCode.PERMISSION_DENIED, message, role)
    return Decision(None, role=role)


def bearer_token(metadata: Any) -> str | None:
    """The token from an ``authorization: Bearer <token>`` header, if any."""
    for key, value in metadata or ():
        if key == AUTH_HEADER and isinstance(value, str) and value.lower().startswith(_BEARER):
            return value[len(_BEARER) :].strip()
    return None


def tokens_from_settings(settings: Any) -> dict[Role, str]:
    """Role -> token from a :class:`stalwart.settings.ServiceSettings`."""
    return {
        Role[name.upper()]: secret.get_secret_value()
        for name, secret in settings.role_tokens().items()
    }


# --- server side -------------------------------------------------------------------


def warn_if_open(tokens: Mapping[Role, str]) -> None:
    """Say once per server that every caller is admin when no token is configured."""
    if not any(tokens.values()):
        log.get_logger("stalwart.auth").warning(
            "authentication off: no tokens configured, every caller is admin"
        )


# --- client side -------------------------------------------------------------------


def token_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """Per-call metadata carrying ``token``: ``stub.Call(req, metadata=..., timeout=...)``."""
    return ((AUTH_HEADER, f"Bearer {token}"),)


def token_call_credentials(token: str) -> grpc.CallCredentials:
    """Call credentials for a TLS channel (gRPC refuses them on plaintext channels)."""
    return grpc.access_token_call_credentials(token)
