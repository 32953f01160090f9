"""Client channels built one way: TLS material, message limits, keepalive, retries, token.

Retry policy: the service config retries UNAVAILABLE (and only that) for every
``stalwart.v1`` method. That is safe because the wire contract makes every
mutating RPC idempotent under retry (request ids, (job, step, slot) keys,
epochs). A future RPC that is not idempotent must get its own ``methodConfig``
entry without a ``retryPolicy`` in :func:`service_config`. Streaming calls are
only retried by gRPC before the first response arrives and while the sent
messages fit its retry buffer; past that the caller sees UNAVAILABLE itself.

Deadline convention: every client call passes ``timeout=``, except streams that
last as long as their peers (watches, telemetry, replication, pushes on one open
call), which bound their own waits. Channels from :func:`open_channel` refuse a
unary call without one (``ValueError``) instead of letting it hang forever;
:func:`call_with_deadline` is the short form that also turns failures into
:class:`stalwart.errors.RpcError`. A role token goes on every call of every type.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc

from stalwart import api
from stalwart.auth import AUTH_HEADER
from stalwart.errors import RpcError
from stalwart.settings import MIB, ServiceSettings

DEFAULT_TIMEOUT_S = 10.0

# Client pings every 30 s on idle connections so a dead peer (or a NAT that
# dropped the flow) is noticed in ~40 s instead of at the next call. The server
# accepts pings this often (see stalwart.server).
KEEPALIVE_OPTIONS = (
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
)

RETRY_POLICY = {
    "maxAttempts": 4,
    "initialBackoff": "0.1s",
    "maxBackoff": "2s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"],
}


def service_config() -> str:
    """gRPC service config JSON: retry UNAVAILABLE on every stalwart.v1 service."""
    names = [{"service": name} for name in api.SERVICE_NAMES]
    return json.dumps({"methodConfig": [{"name": names, "retryPolicy": RETRY_POLICY}]})


@dataclass(frozen=True)
class ChannelConfig:
    """What a client needs to reach a server; build it from settings or by hand."""

    tls_cert: Path | None = None
    """Client certificate (sent to the server when it asks for mTLS)."""
    tls_key: Path | None = None
    """Private key of tls_cert."""
    tls_ca: Path | None = None
    """CA that signed the server's certificate; setting it turns TLS on."""
    max_message_bytes: int = 8 * MIB
    """Largest message sent or received."""
    server_name: str | None = None
    """TLS name to check when the certificate does not name the dialled address."""
    max_reconnect_backoff_s: float | None = None
    """Longest wait between attempts to reconnect to a peer that went away; None keeps
    gRPC's default, which grows to 120 s. Links that must notice a peer coming back
    soon (a primary's links to its backups) set it to about a second."""
    retry_unavailable: bool = True
    """Let gRPC retry UNAVAILABLE transparently (see the module docstring). Liveness
    probes turn it off: a peer that refuses connections must fail the probe at once,
    not after retries have used up the probe's deadline. So do the clients that
    move to another replica themselves on UNAVAILABLE (the coordinator client, a
    trainer's shard group clients) and a primary's links to its backups, which
    resync a backup that failed a call."""

    @classmethod
    def from_settings(cls, settings: ServiceSettings) -> ChannelConfig:
        return cls(
            tls_cert=settings.tls_cert,
            tls_key=settings.tls_key,
            tls_ca=settings.tls_ca,
            max_message_bytes=settings.max_message_bytes,
        )

    @property
    def tls(self) -> bool:
        return self.tls_ca is not None or self.tls_cert is not None

    def options(self) -> list[tuple[str, Any]]:
        opts: list[tuple[str, Any]] = [
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.service_config", service_config()),
            ("grpc.enable_retries", int(self.retry_unavailable)),
            *KEEPALIVE_OPTIONS,
        ]
        if self.server_name:
            opts.append(("grpc.ssl_target_name_override", self.server_name))
        if self.max_reconnect_backoff_s is not None:
            backoff_ms = max(1, int(self.max_reconnect_backoff_s * 1000))
            opts.append(("grpc.max_reconnect_backoff_ms", backoff_ms))
            opts.append(("grpc.initial_reconnect_backoff_ms", min(backoff_ms, 1000)))
        return opts

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.tls_ca),
            private_key=_read(self.tls_key),
            certificate_chain=_read(self.tls_cert),
        )


def _read(path: Path | None) -> bytes | None:
    return Path(path).read_bytes() if path is not None else None


def _config(source: ServiceSettings | ChannelConfig | None) -> ChannelConfig:
    if isinstance(source, ServiceSettings):
        return ChannelConfig.from_settings(source)
    return source or ChannelConfig()


def open_channel(
    address: str,
    config: ServiceSettings | ChannelConfig | None = None,
    role_token: str | None = None,
) -> grpc.aio.Channel:
    """An aio channel to ``host:port``; TLS when the config has TLS material.

    ``role_token`` is sent as ``authorization: Bearer ...`` on every call.
    """
    cfg = _config(config)
    interceptors = _aio_interceptors(role_token)
    if cfg.tls:
        return grpc.aio.secure_channel(
            address, cfg.credentials(), options=cfg.options(), interceptors=interceptors
        )
    return grpc.aio.insecure_channel(address, options=cfg.options(), interceptors=interceptors)


def open_sync_channel(
    address: str,
    config: ServiceSettings | ChannelConfig | None = None,
    role_token: str | None = None,
) -> grpc.Channel:
    """Blocking twin of :func:`open_channel`, for scripts and the CLI."""
    cfg = _config(config)
    if cfg.tls:
        channel = grpc.secure_channel(address, cfg.credentials(), options=cfg.options())
    else:
        channel = grpc.insecure_channel(address, options=cfg.options())
    return grpc.intercept_channel(channel, _SyncClientInterceptor(role_token))


T = TypeVar("T")


async def call_with_deadline(
    rpc: Callable[..., Awaitable[T]],
    request: Any,
    timeout: float = DEFAULT_TIMEOUT_S,
    **kwargs: Any,
) -> T:
    """``await rpc(request, timeout=timeout)``, failures raised as :class:`RpcError`."""
    try:
        return await rpc(request, timeout=timeout, **kwargs)
    except grpc.RpcError as err:
        raise RpcError.from_grpc(err) from err


# --- interceptors: token + deadline check ---------------------------------------------


def _prepare(details: Any, token: str | None) -> Any:
    if details.timeout is None:
        raise ValueError(f"{details.method!r} called without timeout=; every call needs a deadline")
    return _with_token(details, token) if token else details


def _with_token(details: Any, token: str) -> Any:
    metadata = list(details.metadata or ())
    metadata.append((AUTH_HEADER, f"Bearer {token}"))
    return details._replace(metadata=metadata)


class _Holds:
    """An interceptor's role token (None: none configured)."""

    def __init__(self, token: str | None) -> None:
        self._token = token


class _AioUnaryUnary(_Holds, grpc.aio.UnaryUnaryClientInterceptor):
    """Unary calls: the deadline check and the token."""

    async def intercept_unary_unary(self, continuation, client_call_details, request):
        return await continuation(_prepare(client_call_details, self._token), request)


class _AioUnaryStream(_Holds, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, client_call_details, request):
        return await continuation(_with_token(client_call_details, self._token), request)


class _AioStreamUnary(_Holds, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return await continuation(_with_token(client_call_details, self._token), request_iterator)


class _AioStreamStream(_Holds, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return await continuation(_with_token(client_call_details, self._token), request_iterator)


def _aio_interceptors(token: str | None) -> list[grpc.aio.ClientInterceptor]:
    """One interceptor per call type: a grpc.aio channel files each interceptor under
    the first call type its class matches and under no other, so one object serving
    all four would see unary calls only (streaming calls went out without the token).
    Streams get the token alone, and no interceptor at all without one: they are
    exempt from the deadline check (a watch, telemetry, replication or pushes on one
    open call last as long as their peers and bound their own waits)."""
    interceptors: list[grpc.aio.ClientInterceptor] = [_AioUnaryUnary(token)]
    if token:
        interceptors += [_AioUnaryStream(token), _AioStreamUnary(token), _AioStreamStream(token)]
    return interceptors


class _SyncClientInterceptor(
    _Holds,
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """All four call types in one object: grpc.intercept_channel, unlike grpc.aio's
    channel, asks the same interceptor for each type it implements."""

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(_prepare(client_call_details, self._token), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(_prepare(client_call_details, self._token), request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return continuation(_prepare(client_call_details, self._token), request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return continuation(_prepare(client_call_details, self._token), request_iterator)


def cancelled_by_caller() -> bool:
    """Whether the running task was asked to cancel (``Task.cancel``), as opposed to a
    CancelledError that grpc.aio raised for a call that was cancelled by itself or by
    another task (a broken client stream, a watch ended by its checks)."""
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0
