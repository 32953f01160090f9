"""Prometheus metrics: the /metrics endpoint and the gRPC server series.

gRPC server series use the names py-grpc-prometheus exports, so its dashboards
work unchanged; that package only wraps sync servers, hence :class:`MethodMetrics`
here (fed by :mod:`stalwart.instrument`). Our own series live under ``stalwart_``
with base-unit suffixes, and no label ever takes an unbounded value (no step,
tensor or job names).
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import grpc
from prometheus_client import Counter, Histogram, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from stalwart.errors import CALL_GONE, ErrorKind

GRPC_SERVER_STARTED = Counter(
    "grpc_server_started_total",
    "RPCs started on the server.",
    ["grpc_type", "grpc_service", "grpc_method"],
)
GRPC_SERVER_HANDLED = Counter(
    "grpc_server_handled_total",
    "RPCs completed on the server, whatever their status.",
    ["grpc_type", "grpc_service", "grpc_method", "grpc_code"],
)
GRPC_SERVER_HANDLING_SECONDS = Histogram(
    "grpc_server_handling_seconds",
    "Time from the start of an RPC to its end on the server.",
    ["grpc_type", "grpc_service", "grpc_method"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
RPC_ERRORS = Counter(
    "stalwart_rpc_errors_total",
    "RPCs answered with an error, by ErrorInfo reason (a closed set: the ErrorKind table).",
    ["reason"],
)
# Every reason from the start: the series exist at 0 before the first error, so a
# dashboard's rate() has a baseline and a scrape shows what can be counted.
for _kind in ErrorKind:
    RPC_ERRORS.labels(_kind.reason)


# How often the /metrics thread looks for a shutdown() request. prometheus_client's
# start_http_server serves with the standard library's 0.5 s, so every service
# spent up to half a second of its SIGTERM handling (the event loop blocked)
# waiting for the endpoint to stop.
METRICS_STOP_POLL_S = 0.05


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass  # a scrape is not worth a line on stderr


def start_metrics_server(port: int, host: str = "127.0.0.1") -> tuple[Any, int]:
    """Serve /metrics on ``host:port`` in a daemon thread; port 0 picks a free one.

    Returns the HTTP server (``.shutdown()`` stops it within METRICS_STOP_POLL_S)
    and the port it bound.
    """
    family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    server_class = type("MetricsServer", (ThreadingWSGIServer,), {"address_family": family})
    httpd = make_server(
        str(sockaddr[0]), port, make_wsgi_app(), server_class, handler_class=_QuietHandler
    )
    threading.Thread(
        target=httpd.serve_forever, args=(METRICS_STOP_POLL_S,), name="metrics", daemon=True
    ).start()
    return httpd, httpd.server_port


# --- per-method series -------------------------------------------------------

_BEHAVIOR_FIELD = {
    (False, False): "unary_unary",
    (False, True): "unary_stream",
    (True, False): "stream_unary",
    (True, True): "stream_stream",
}
_GRPC_TYPE = {
    (False, False): "UNARY",
    (False, True): "SERVER_STREAM",
    (True, False): "CLIENT_STREAM",
    (True, True): "BIDI_STREAM",
}


def behavior_field(handler: grpc.RpcMethodHandler) -> str:
    """Name of the handler attribute holding the behavior (``unary_unary`` ...)."""
    return _BEHAVIOR_FIELD[(handler.request_streaming, handler.response_streaming)]


def grpc_type(handler: grpc.RpcMethodHandler) -> str:
    """py-grpc-prometheus's name of the handler's shape (``UNARY`` ...)."""
    return _GRPC_TYPE[(handler.request_streaming, handler.response_streaming)]


def split_method(method: str) -> tuple[str, str]:
    """``/pkg.Service/Method`` -> (``pkg.Service``, ``Method``)."""
    _, service, name = method.split("/", 2)
    return service, name


class MethodMetrics:
    """One method's server series, looked up once: ``labels()`` takes a lock and
    builds a key on every call, and a sync step makes ten calls on the primary."""

    def __init__(self, grpc_type: str, service: str, method: str) -> None:
        self._labels = (grpc_type, service, method)
        self._started = GRPC_SERVER_STARTED.labels(*self._labels)
        self._seconds = GRPC_SERVER_HANDLING_SECONDS.labels(*self._labels)
        self._handled: dict[str, Any] = {}

    def start(self) -> float:
        """Count a call as started; the time to hand to :meth:`finish`."""
        self._started.inc()
        return time.perf_counter()

    def finish(self, started: float, code: grpc.StatusCode | int) -> None:
        self._seconds.observe(time.perf_counter() - started)
        name = _code_name(code)
        handled = self._handled.get(name)
        if handled is None:
            handled = self._handled[name] = GRPC_SERVER_HANDLED.labels(*self._labels, name)
        handled.inc()


def failure_code(exc: BaseException, context: grpc.aio.ServicerContext) -> grpc.StatusCode:
    """The status a call ends with when its handler raised ``exc``."""
    if isinstance(exc, grpc.aio.AbortError):
        # abort()/abort_with_status() already recorded the code on the context
        return context.code() or grpc.StatusCode.UNKNOWN
    if isinstance(exc, CALL_GONE):
        return grpc.StatusCode.CANCELLED  # client or server went away, or deadline passed
    return grpc.StatusCode.UNKNOWN


def _code_name(code: grpc.StatusCode | int) -> str:
    if isinstance(code, grpc.StatusCode):
        return code.name
    for status in grpc.StatusCode:  # some grpc versions hand back the int value
        if status.value[0] == code:
            return status.name
    return "UNKNOWN"
