"""Prometheus metrics: the /metrics endpoint and the gRPC server interceptor.

gRPC server series use the names py-grpc-prometheus exports, so its dashboards
work unchanged; that package only wraps sync servers, hence the aio interceptor
here. Our own series live under ``stalwart_`` with base-unit suffixes, and no
label ever takes an unbounded value (no step, tensor or job names).
"""

from __future__ import annotations

import asyncio
import inspect
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import grpc
from prometheus_client import Counter, Histogram, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from stalwart.errors import ErrorKind

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


# --- wrapping handlers -------------------------------------------------------

Around = Callable[[grpc.aio.ServicerContext], AbstractAsyncContextManager[None]]

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


def wrap_handler(handler: grpc.RpcMethodHandler, around: Around) -> grpc.RpcMethodHandler:
    """Run the handler's behavior inside ``around(context)``, whatever its shape.

    The aio server picks how to drive a streaming-response behavior from its
    function type (async generator vs. coroutine using ``context.write``), so
    the wrapper must keep that type. Sync behaviors (thread-pool servers) are
    left alone: Stalwart servers are aio only.
    """
    field = behavior_field(handler)
    behavior = getattr(handler, field)
    if inspect.isasyncgenfunction(behavior):

        async def wrapped_gen(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator:
            async with around(context):
                async for response in behavior(request, context):
                    yield response

        return handler._replace(**{field: wrapped_gen})
    if inspect.iscoroutinefunction(behavior):

        async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> Any:
            async with around(context):
                return await behavior(request, context)

        return handler._replace(**{field: wrapped})
    return handler


def split_method(method: str) -> tuple[str, str]:
    """``/pkg.Service/Method`` -> (``pkg.Service``, ``Method``)."""
    _, service, name = method.split("/", 2)
    return service, name


# --- the interceptor -------------------------------------------------------------


class ServerMetricsInterceptor(grpc.aio.ServerInterceptor):
    """Counts and times every RPC under py-grpc-prometheus's series names.

    Put it first in the interceptor list so that calls refused by the auth
    interceptor are counted with their code too.
    """

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:  # unknown method: grpc answers UNIMPLEMENTED itself
            return handler
        service, method = split_method(handler_call_details.method)
        grpc_type = _GRPC_TYPE[(handler.request_streaming, handler.response_streaming)]
        labels = (grpc_type, service, method)
        return wrap_handler(handler, lambda context: _observe(labels, context))


@asynccontextmanager
async def _observe(
    labels: tuple[str, str, str], context: grpc.aio.ServicerContext
) -> AsyncIterator[None]:
    GRPC_SERVER_STARTED.labels(*labels).inc()
    start = time.perf_counter()
    code = grpc.StatusCode.UNKNOWN
    try:
        yield
        # A handler may set a code without aborting (context.set_code + return).
        code = context.code() or grpc.StatusCode.OK
    except grpc.aio.AbortError:
        # abort()/abort_with_status() already recorded the code on the context.
        code = context.code() or grpc.StatusCode.UNKNOWN
        raise
    except (asyncio.CancelledError, GeneratorExit):
        code = grpc.StatusCode.CANCELLED  # client went away or deadline passed
        raise
    finally:
        GRPC_SERVER_HANDLED.labels(*labels, _code_name(code)).inc()
        GRPC_SERVER_HANDLING_SECONDS.labels(*labels).observe(time.perf_counter() - start)


def _code_name(code: grpc.StatusCode | int) -> str:
    if isinstance(code, grpc.StatusCode):
        return code.name
    for status in grpc.StatusCode:  # some grpc versions hand back the int value
        if status.value[0] == code:
            return status.name
    return "UNKNOWN"
