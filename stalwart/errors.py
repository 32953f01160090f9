"""One table of error kinds, mapped to gRPC status codes.

Servers raise :class:`StalwartError`; the server bootstrap turns it into a gRPC
status carrying a ``google.rpc.ErrorInfo`` (reason, domain, metadata) so that a
client in any language can branch on ``reason``. Clients get
:class:`RpcError` back, with the same ``kind``.

Status code meanings (the contract clients rely on):
  UNAVAILABLE          retry the same call.
  ABORTED              retry higher up (re-pull, recompute, then push again).
  FAILED_PRECONDITION  do not retry until the state changes (stale epoch, not primary).
  DATA_LOSS            a checksum failed; nothing was applied.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Mapping

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc._cython import cygrpc
from grpc_status import rpc_status

DOMAIN = "stalwart.dev"

# What a handler sees when its call is gone and nothing went wrong in it: the client
# went away or its deadline passed (cancellation; GeneratorExit in a closed stream),
# or the server stopped under the call (grpc.aio raises its private
# _ServerStoppedError into a read, write or answer after that). The bootstrap lets
# these through unlogged and the metrics count them CANCELLED; one tuple, so the
# two cannot drift apart.
CALL_GONE: tuple[type[BaseException], ...] = (
    asyncio.CancelledError,
    GeneratorExit,
    *filter(None, [getattr(cygrpc, "_ServerStoppedError", None)]),
)

# An error's message and each ErrorInfo value travel in the answer's trailing
# metadata, which gRPC refuses past 8-16 KiB in all: a message echoing a
# 200,000-character job id reached the client as "received metadata size exceeds
# hard limit", without its code or reason. Clipped here, where every answer's error
# is built, so no caller has to remember it; in bytes, since a non-ASCII byte is
# percent-encoded to three in the grpc-message header.
MAX_MESSAGE_BYTES = 1024
MAX_METADATA_BYTES = 256  # a leader address, a chunk hash, a store URL


def clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes, saying how much was left out."""
    encoded = text.encode()
    if len(encoded) <= limit:
        return text
    kept = encoded[:limit].decode(errors="ignore")  # never half a character
    return f"{kept}... ({len(text) - len(kept)} more characters)"


class ErrorKind(enum.Enum):
    """Every error a Stalwart service answers with: (status code, reason)."""

    INVALID_ARGUMENT = (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")
    BAD_SHAPE = (grpc.StatusCode.INVALID_ARGUMENT, "BAD_SHAPE")
    BAD_DTYPE = (grpc.StatusCode.INVALID_ARGUMENT, "BAD_DTYPE")
    NON_FINITE = (grpc.StatusCode.INVALID_ARGUMENT, "NON_FINITE")
    TRUNCATED_STREAM = (grpc.StatusCode.INVALID_ARGUMENT, "TRUNCATED_STREAM")
    BAD_STREAM = (grpc.StatusCode.INVALID_ARGUMENT, "BAD_STREAM")
    LIMIT_EXCEEDED = (grpc.StatusCode.RESOURCE_EXHAUSTED, "LIMIT_EXCEEDED")
    STORE_FULL = (grpc.StatusCode.RESOURCE_EXHAUSTED, "STORE_FULL")
    CHECKSUM_MISMATCH = (grpc.StatusCode.DATA_LOSS, "CHECKSUM_MISMATCH")
    DATA_LOSS = (grpc.StatusCode.DATA_LOSS, "DATA_LOSS")  # stored data missing or unreadable
    UNKNOWN_JOB = (grpc.StatusCode.NOT_FOUND, "UNKNOWN_JOB")
    UNKNOWN_NODE = (grpc.StatusCode.NOT_FOUND, "UNKNOWN_NODE")
    NOT_FOUND = (grpc.StatusCode.NOT_FOUND, "NOT_FOUND")
    ALREADY_EXISTS = (grpc.StatusCode.ALREADY_EXISTS, "ALREADY_EXISTS")
    CONFLICTING_PUSH = (grpc.StatusCode.ALREADY_EXISTS, "CONFLICTING_PUSH")
    STALE_EPOCH = (grpc.StatusCode.FAILED_PRECONDITION, "STALE_EPOCH")
    NOT_PRIMARY = (grpc.StatusCode.FAILED_PRECONDITION, "NOT_PRIMARY")
    NOT_LEADER = (grpc.StatusCode.FAILED_PRECONDITION, "NOT_LEADER")
    FENCED = (grpc.StatusCode.FAILED_PRECONDITION, "FENCED")
    # the caller names a higher epoch than the replica (or leader) was given: refused,
    # never adopted (only the coordinator's configuration calls raise an epoch)
    UNKNOWN_EPOCH = (grpc.StatusCode.FAILED_PRECONDITION, "UNKNOWN_EPOCH")
    REPLICA_BEHIND = (grpc.StatusCode.FAILED_PRECONDITION, "REPLICA_BEHIND")
    FAILED_PRECONDITION = (grpc.StatusCode.FAILED_PRECONDITION, "FAILED_PRECONDITION")
    TOO_STALE = (grpc.StatusCode.ABORTED, "TOO_STALE")
    NO_INSYNC_BACKUP = (grpc.StatusCode.UNAVAILABLE, "NO_INSYNC_BACKUP")
    UNAVAILABLE = (grpc.StatusCode.UNAVAILABLE, "UNAVAILABLE")
    DEADLINE_EXCEEDED = (grpc.StatusCode.DEADLINE_EXCEEDED, "DEADLINE_EXCEEDED")
    UNAUTHENTICATED = (grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED")
    PERMISSION_DENIED = (grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED")
    INTERNAL = (grpc.StatusCode.INTERNAL, "INTERNAL")

    @property
    def code(self) -> grpc.StatusCode:
        return self.value[0]

    @property
    def reason(self) -> str:
        return self.value[1]

    @classmethod
    def from_reason(cls, reason: str, code: grpc.StatusCode) -> ErrorKind:
        for kind in cls:
            if kind.reason == reason:
                return kind
        for kind in cls:  # unknown reason: fall back to the code's generic kind
            if kind.code == code and kind.reason == code.name:
                return kind
        return cls.INTERNAL


class StalwartError(Exception):
    """An error a server answers with; raised anywhere below a handler."""

    def __init__(self, kind: ErrorKind, message: str, **metadata: object) -> None:
        message = clip(message, MAX_MESSAGE_BYTES)
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.metadata = {k: clip(str(v), MAX_METADATA_BYTES) for k, v in metadata.items()}

    def __str__(self) -> str:
        return f"{self.kind.reason}: {self.message}"

    def to_status(self) -> grpc.Status:
        """The gRPC status (code, message, ErrorInfo details) for this error."""
        info = error_details_pb2.ErrorInfo(
            reason=self.kind.reason, domain=DOMAIN, metadata=self.metadata
        )
        detail = any_pb2.Any()
        detail.Pack(info)
        proto = status_pb2.Status(
            code=self.kind.code.value[0], message=self.message, details=[detail]
        )
        return rpc_status.to_status(proto)


class RpcError(Exception):
    """Client-side view of a failed call: the status plus the server's reason."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        reason: str = "",
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.reason = reason or code.name
        self.metadata = dict(metadata or {})
        self.kind = ErrorKind.from_reason(self.reason, code)

    @classmethod
    def from_grpc(cls, err: grpc.RpcError) -> RpcError:
        """Wrap a grpc error, reading ErrorInfo from its rich status if present."""
        code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
        message = err.details() if hasattr(err, "details") else str(err)
        reason, metadata = "", {}
        status = _rich_status(err)
        if status is not None:
            for detail in status.details:
                if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                    info = error_details_pb2.ErrorInfo()
                    detail.Unpack(info)
                    reason, metadata = info.reason, dict(info.metadata)
        return cls(code, message or "", reason, metadata)

    @property
    def retryable(self) -> bool:
        return self.code == grpc.StatusCode.UNAVAILABLE


def _rich_status(err: grpc.RpcError) -> status_pb2.Status | None:
    trailing = err.trailing_metadata() if hasattr(err, "trailing_metadata") else None
    for key, value in trailing or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status()
            status.ParseFromString(value)
            return status
    return None
