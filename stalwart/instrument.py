"""What every RPC a Stalwart server answers runs through: metrics, log context, auth.

Each method's handler is wrapped once, when the service registers it, instead of
by server interceptors on every call. grpc.aio runs interceptors as a chain of
coroutines per call, and each of the three (metrics, log context, auth) built a
new wrapped handler and looked its Prometheus series up again. In a throwaway
grpc.aio script on the 2-core development machine a unary call cost the server
500-600 µs of CPU with the three, 430-460 µs wrapped once and 390-440 µs with
nothing (docs/performance.md, "CPU per step on an idle machine").

The order per call is the interceptors' was: the metrics see every call (refused
ones too), the log context is cleared and names the method, then the bearer
token is checked against :data:`stalwart.auth.METHOD_ROLES`; only then does the
handler run.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import grpc

from stalwart import log
from stalwart.auth import Role, authorize, bearer_token, warn_if_open
from stalwart.metrics import MethodMetrics, behavior_field, failure_code, grpc_type, split_method


class WrappingRegistrar:
    """Stands in for the ``grpc.aio.Server`` while services register their handlers,
    and registers each one wrapped (:func:`wrap`); everything else goes to the server."""

    def __init__(self, server: grpc.aio.Server, tokens: Mapping[Role, str]) -> None:
        self._server = server
        self._tokens = dict(tokens)
        warn_if_open(self._tokens)

    def add_registered_method_handlers(self, service: str, handlers: Mapping[str, Any]) -> None:
        wrapped = {
            name: wrap(f"/{service}/{name}", handler, self._tokens)
            for name, handler in handlers.items()
        }
        self._server.add_registered_method_handlers(service, wrapped)

    def add_generic_rpc_handlers(self, handlers) -> None:
        self._server.add_generic_rpc_handlers(
            tuple(_WrappedGeneric(h, self._tokens) for h in handlers)
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)


class _WrappedGeneric(grpc.GenericRpcHandler):
    """A generic handler whose method handlers come back wrapped, each wrapped once."""

    def __init__(self, inner: grpc.GenericRpcHandler, tokens: Mapping[Role, str]) -> None:
        self._inner = inner
        self._tokens = tokens
        self._cache: dict[str, tuple[Any, Any]] = {}

    def service(self, handler_call_details):
        handler = self._inner.service(handler_call_details)
        if handler is None:  # not ours: grpc tries the next one, or answers UNIMPLEMENTED
            return None
        method = handler_call_details.method
        cached = self._cache.get(method)
        if cached is None or cached[0] is not handler:
            cached = self._cache[method] = (handler, wrap(method, handler, self._tokens))
        return cached[1]


def wrap(method: str, handler: grpc.RpcMethodHandler, tokens: Mapping[Role, str]):
    """``handler`` with its behavior run inside the per-call work, whatever its shape.

    The aio server picks how to drive a streaming-response behavior from its
    function type (async generator vs. coroutine using ``context.write``), so the
    wrapper keeps that type. Sync behaviors are left alone: Stalwart servers are
    aio only.
    """
    field = behavior_field(handler)
    behavior = getattr(handler, field)
    service, name = split_method(method)
    series = MethodMetrics(grpc_type(handler), service, name)
    admit = _admission(method, tokens)

    if inspect.isasyncgenfunction(behavior):

        async def wrapped_gen(request: Any, context: grpc.aio.ServicerContext):
            started = series.start()
            try:
                await admit(context)
                async for response in behavior(request, context):
                    yield response
            except BaseException as exc:
                series.finish(started, failure_code(exc, context))
                raise
            series.finish(started, context.code() or grpc.StatusCode.OK)

        return handler._replace(**{field: wrapped_gen})
    if inspect.iscoroutinefunction(behavior):

        async def wrapped(request: Any, context: grpc.aio.ServicerContext):
            started = series.start()
            try:
                await admit(context)
                response = await behavior(request, context)
            except BaseException as exc:
                series.finish(started, failure_code(exc, context))
                raise
            # a handler may set a code without aborting (context.set_code + return)
            series.finish(started, context.code() or grpc.StatusCode.OK)
            return response

        return handler._replace(**{field: wrapped})
    return handler


def _admission(method: str, tokens: Mapping[Role, str]):
    """The per-call check before a handler runs: a clean log context naming the
    method, then the bearer token (a refused call is aborted with its status)."""

    async def admit(context: grpc.aio.ServicerContext) -> None:
        log.clear()
        log.bind(rpc=method)
        decision = authorize(method, bearer_token(context.invocation_metadata()), tokens)
        if decision.allowed:
            return
        log.get_logger("stalwart.auth").info(
            "rpc refused", rpc=method, code=decision.code.name, why=decision.message
        )
        await context.abort(decision.code, decision.message)

    return admit
