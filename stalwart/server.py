"""The one bootstrap every Stalwart service runs its gRPC server through.

It builds a ``grpc.aio`` server whose handlers are wrapped for metrics, auth and
log context (:mod:`stalwart.instrument`), with message limits and keepalive from
:class:`ServiceSettings`, adds ``grpc.health.v1`` and server reflection, binds
TLS (mTLS with a CA) or plaintext — plaintext off loopback only with
``--insecure`` — starts /metrics, writes the ready file, and on SIGTERM/SIGINT goes NOT_SERVING, runs the
service's shutdown hook and stops within ``grace_seconds``.

A service's ``__main__`` is typically::

    def main() -> None:
        settings = MySettings.from_args()
        run_service(settings, lambda server: add_MyServicer_to_server(impl, server),
                    ["stalwart.v1.MyService"], service="my")
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import ipaddress
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pydantic
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from stalwart import limits, log, reflection
from stalwart.auth import tokens_from_settings
from stalwart.errors import CALL_GONE, ErrorKind, StalwartError
from stalwart.instrument import WrappingRegistrar
from stalwart.metrics import RPC_ERRORS, start_metrics_server
from stalwart.settings import ServiceSettings

HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name

ShutdownHook = Callable[[], Awaitable[None] | None]

# The server lets clients ping every 10 s without calls in flight, below the
# 30 s client keepalive in stalwart.channel (otherwise it would answer GOAWAY
# "too_many_pings"). It pings idle clients itself to drop dead connections.
SERVER_KEEPALIVE_OPTIONS = (
    ("grpc.keepalive_time_ms", 60_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_pings_without_data", 0),
)


class ConfigError(Exception):
    """The settings cannot be served as given (the process exits with status 2)."""


# --- handler decorator ------------------------------------------------------------


def rpc_handler(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Answer a :class:`StalwartError` with its status and ErrorInfo; anything else INTERNAL.

    Use on ``async def`` methods and on ``async def ... yield`` (server-streaming)
    methods alike; the context must be the last positional argument.
    """
    if inspect.isasyncgenfunction(fn):

        @functools.wraps(fn)
        async def stream_wrapper(*args: Any) -> AsyncIterator[Any]:
            async with _answer_errors(args[-1], fn.__qualname__):
                async for response in fn(*args):
                    yield response

        return stream_wrapper
    return _unary_answer(fn, drain=False)


def _unary_answer(fn: Callable[..., Any], drain: bool) -> Callable[..., Any]:
    if not inspect.iscoroutinefunction(fn):
        raise TypeError(f"rpc_handler needs an async function, got {fn!r}")

    @functools.wraps(fn)
    async def unary_wrapper(*args: Any) -> Any:
        requests = args[-2] if drain else None
        async with _answer_errors(args[-1], fn.__qualname__, requests=requests):
            return await fn(*args)

    return unary_wrapper


# A refusal of a client-streaming call made with ``drain_on_refusal`` first reads what
# the client is still sending, for at most this long: a grpc.aio client whose write
# fails after the status arrived reports INTERNAL instead of that status
# (grpc/grpc#36066; a toy server refusing after the first of seven 4 MiB messages
# had 6 of 50 calls end INTERNAL, none once it read the rest first). A refused
# push's bytes are thus still uploaded, for at most this long.
DRAIN_BEFORE_REFUSAL_S = 2.0


def drain_on_refusal(fn: Callable[..., Any]) -> Callable[..., Any]:
    """:func:`rpc_handler` for a stream-unary method that may refuse before the end of
    its request stream (the request iterator must be the argument before the context).
    Not for bidirectional or long-lived streams: the refusal waits for the drain."""
    return _unary_answer(fn, drain=True)


async def _drain(requests) -> None:
    async def rest() -> None:
        async for _ in requests:
            pass

    with contextlib.suppress(Exception):  # a bad or cut stream: refuse as planned
        await asyncio.wait_for(rest(), DRAIN_BEFORE_REFUSAL_S)


@asynccontextmanager
async def _answer_errors(
    context: grpc.aio.ServicerContext, where: str, requests=None
) -> AsyncIterator[None]:
    try:
        yield
    except StalwartError as err:
        RPC_ERRORS.labels(err.kind.reason).inc()
        log.get_logger("stalwart.rpc").info(
            "rpc error", reason=err.kind.reason, error=err.message, handler=where
        )
        if requests is not None:
            await _drain(requests)
        await context.abort_with_status(err.to_status())
    except (grpc.aio.AbortError, *CALL_GONE):
        raise  # already answered, or the call is gone
    except Exception as exc:
        RPC_ERRORS.labels(ErrorKind.INTERNAL.reason).inc()
        log.get_logger("stalwart.rpc").exception("unexpected error in handler", handler=where)
        internal = StalwartError(ErrorKind.INTERNAL, f"internal error ({type(exc).__name__})")
        await context.abort_with_status(internal.to_status())


# --- binding -------------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a DNS name: cannot promise it stays on this machine


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def _connect_host(host: str) -> str:
    # A wildcard bind is reachable locally through loopback.
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "[::]": "::1", "": "127.0.0.1"}.get(host, host)


def server_credentials(settings: ServiceSettings) -> grpc.ServerCredentials:
    ca = settings.tls_ca.read_bytes() if settings.tls_ca else None
    pair = (settings.tls_key.read_bytes(), settings.tls_cert.read_bytes())
    return grpc.ssl_server_credentials([pair], root_certificates=ca, require_client_auth=bool(ca))


def check_transport(settings: ServiceSettings) -> None:
    """Refuse plaintext off loopback unless ``--insecure`` was given."""
    if settings.tls_enabled or is_loopback(settings.host):
        return
    if not settings.insecure:
        raise ConfigError(
            f"refusing to serve plaintext on non-loopback host {settings.host!r}: "
            "set --tls-cert/--tls-key (and --tls-ca for mTLS), or pass --insecure "
            "inside a private network"
        )
    log.get_logger("stalwart.server").warning(
        "serving PLAINTEXT on a non-loopback host because --insecure was given",
        host=settings.host,
    )


def _bind(server: grpc.aio.Server, settings: ServiceSettings) -> int:
    address = _join(settings.host, settings.port)
    try:
        if settings.tls_enabled:
            port = server.add_secure_port(address, server_credentials(settings))
        else:
            port = server.add_insecure_port(address)
    except RuntimeError as exc:  # grpc raises RuntimeError when it cannot bind
        raise ConfigError(f"cannot bind {address}: {exc}") from exc
    if port == 0:  # older grpc versions report failure this way
        raise ConfigError(f"cannot bind {address}")
    return port


def write_ready_file(path: Path, payload: dict[str, Any]) -> None:
    """Write JSON so a reader sees either no file or the whole file (tmp + rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload))
    os.replace(tmp, path)


# --- the runner ----------------------------------------------------------------------


class ServiceRunner:
    """One service process's server: start, report ready, serve, stop gracefully."""

    def __init__(
        self,
        settings: ServiceSettings,
        register: Callable[[grpc.aio.Server], None],
        service_names: Sequence[str],
        on_shutdown: ShutdownHook | None = None,
        *,
        initially_serving: bool = True,
        services_ready_at_start: bool = True,
    ) -> None:
        self.settings = settings
        self.service_names = list(service_names)
        self.health = health.aio.HealthServicer()
        self._register = register
        self._on_shutdown = on_shutdown
        self._initially_serving = initially_serving
        # False: each service name starts NOT_SERVING (not ready: a standby, a backup)
        # while "" reports the process alive; the service flips its names itself.
        self._services_ready_at_start = services_ready_at_start
        self._server: grpc.aio.Server | None = None
        self._metrics_httpd: Any = None
        self._stop = asyncio.Event()
        self.port = 0
        self.metrics_port: int | None = None
        self._log = log.get_logger("stalwart.server")

    @property
    def address(self) -> str:
        """``host:port`` a local client dials."""
        return _join(_connect_host(self.settings.host), self.port)

    async def set_serving(self, serving: bool, service: str | None = None) -> None:
        """Report SERVING / NOT_SERVING for one service name, or for all (and "")."""
        states = health_pb2.HealthCheckResponse
        status = states.SERVING if serving else states.NOT_SERVING
        for name in [service] if service is not None else ["", *self.service_names]:
            await self.health.set(name, status)

    async def start(self) -> None:
        """Build, bind and start the server, start /metrics, write the ready file."""
        check_transport(self.settings)
        server = self._build_server()
        self.port = _bind(server, self.settings)
        await server.start()
        self._server = server
        await self.set_serving(self._initially_serving, "")
        for name in self.service_names:
            await self.set_serving(self._initially_serving and self._services_ready_at_start, name)
        self._start_metrics()
        self._write_ready()
        self._log.info(
            "serving",
            address=self.address,
            metrics_port=self.metrics_port,
            tls=self.settings.tls_enabled,
            mtls=self.settings.mtls_enabled,
            services=self.service_names,
        )

    def _build_server(self) -> grpc.aio.Server:
        s = self.settings
        # no interceptors: metrics, log context and auth wrap each handler once,
        # as it is registered (stalwart.instrument), instead of on every call
        server = grpc.aio.server(
            options=[
                ("grpc.max_send_message_length", s.max_message_bytes),
                # from the same table as validation: oversize requests are refused
                # (RESOURCE_EXHAUSTED) before they are parsed or reach a handler
                (
                    "grpc.max_receive_message_length",
                    limits.max_request_bytes(self.service_names, s.max_message_bytes),
                ),
                ("grpc.so_reuseport", 0),  # a second server on a taken port must fail
                *SERVER_KEEPALIVE_OPTIONS,
            ],
        )
        registrar = WrappingRegistrar(server, tokens_from_settings(s))
        self._register(registrar)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, registrar)
        reflection.enable(registrar, [*self.service_names, HEALTH_SERVICE])
        return server

    def _start_metrics(self) -> None:
        if self.settings.metrics_port < 0:
            return
        try:
            self._metrics_httpd, self.metrics_port = start_metrics_server(
                self.settings.metrics_port, self.settings.host
            )
        except OSError as exc:
            port = self.settings.metrics_port
            raise ConfigError(f"cannot serve /metrics on port {port}: {exc}") from exc

    def _write_ready(self) -> None:
        if self.settings.ready_file is None:
            return
        write_ready_file(
            self.settings.ready_file,
            {
                "address": self.address,
                "metrics_port": self.metrics_port,
                "pid": os.getpid(),
                "node_id": self.settings.node_id,
                "tls": self.settings.tls_enabled,
            },
        )

    def request_stop(self) -> None:
        """Ask :meth:`run` / :meth:`wait` to shut down (what SIGTERM does)."""
        self._stop.set()

    async def wait(self) -> None:
        """Serve until SIGTERM/SIGINT or :meth:`request_stop`, then stop gracefully."""
        self._install_signal_handlers()
        await self._stop.wait()
        await self.stop()

    async def run(self) -> None:
        await self.start()
        await self.wait()

    def _install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self._on_signal, sig)
            except (NotImplementedError, RuntimeError, ValueError):
                pass  # not the main thread (tests running a server in-process)

    def _on_signal(self, sig: signal.Signals) -> None:
        self._log.info("signal received, shutting down", signal=sig.name)
        self._stop.set()

    async def stop(self) -> None:
        """NOT_SERVING, the service's hook, then in-flight RPCs finish within the grace."""
        if self._server is None:
            return
        deadline = time.monotonic() + self.settings.grace_seconds
        await self.health.enter_graceful_shutdown()
        await self._run_shutdown_hook(deadline)
        await self._server.stop(max(0.0, deadline - time.monotonic()))
        self._server = None
        if self._metrics_httpd is not None:
            self._metrics_httpd.shutdown()
            self._metrics_httpd.server_close()
        if self.settings.ready_file is not None:
            self.settings.ready_file.unlink(missing_ok=True)
        self._log.info("stopped")

    async def _run_shutdown_hook(self, deadline: float) -> None:
        if self._on_shutdown is None:
            return
        try:
            result = self._on_shutdown()
            if inspect.isawaitable(result):
                await asyncio.wait_for(result, max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            self._log.warning("shutdown hook ran past the grace period")
        except Exception:
            self._log.exception("shutdown hook failed")


async def serve(
    settings: ServiceSettings,
    register: Callable[[grpc.aio.Server], None],
    service_names: Sequence[str],
    on_shutdown: ShutdownHook | None = None,
) -> None:
    """Run a service's server until SIGTERM/SIGINT; see :class:`ServiceRunner`."""
    await ServiceRunner(settings, register, service_names, on_shutdown).run()


def run_service(
    settings: ServiceSettings,
    register: Callable[[grpc.aio.Server], None],
    service_names: Sequence[str],
    on_shutdown: ShutdownHook | None = None,
    *,
    service: str = "stalwart",
) -> None:
    """Process entry point: configure logging, serve, exit 0 on a clean stop, 2 on bad config."""
    log.configure_logging(settings.log_level, service, settings.node_id)
    run_process(lambda s: serve(s, register, service_names, on_shutdown), settings)


def run_process(run: Callable[[Any], Awaitable[None]], settings: ServiceSettings) -> None:
    """The rest of a service's process: ``asyncio.run(run(settings))``; a ConfigError is
    logged and printed as one ``Error:`` line, exit 2; after a clean stop the process
    ends without interpreter teardown (:func:`exit_after_clean_stop`)."""
    try:
        asyncio.run(run(settings))
    except ConfigError as exc:
        log.get_logger("stalwart.server").error("cannot start", error=str(exc))
        print(f"Error: {exc}", file=sys.stderr)
        sys.exit(2)
    exit_after_clean_stop(0)


def exit_after_clean_stop(code: int = 0) -> None:
    """End the process at once after a service has stopped, skipping interpreter teardown.

    Call it after ``asyncio.run`` has returned: the server has stopped (in-flight
    RPCs finished within the grace) and the loop's executor threads are joined.
    Teardown would only free memory object by object, which with torch loaded
    (and the torch._dynamo that optimizers import) took 1-3 s on a two-core
    machine, 5-11 s when it was busy, all after the "stopped" line. Logs are
    flushed first. If a thread that a normal exit waits for (not a daemon) is
    still running, this returns and the interpreter exits the usual way, waiting
    for it: whatever it does is not cut short.
    """
    running = [
        t.name
        for t in threading.enumerate()
        if t is not threading.main_thread() and not t.daemon and t.is_alive()
    ]
    if running:
        log.get_logger("stalwart.server").info(
            "threads still running; the interpreter waits for them", threads=running
        )
        return
    log.get_logger("stalwart.server").info("exiting without interpreter teardown", code=code)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


S = TypeVar("S", bound=ServiceSettings)


def settings_or_exit(cls: type[S], argv: Sequence[str] | None = None) -> S:
    """``cls.from_args(argv)``, printing validation errors (one line each) and exiting 2
    like argparse."""
    try:
        return cls.from_args(argv, prog=_prog())
    except pydantic.ValidationError as exc:
        for line in settings_errors(exc):
            print(f"Error: invalid settings: {line}", file=sys.stderr)
        sys.exit(2)


def _prog() -> str | None:
    """``python -m services.paramserver`` for usage and --help, not ``__main__.py``."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return f"python -m {spec.name.removesuffix('.__main__')}" if spec else None


def settings_errors(exc: pydantic.ValidationError) -> list[str]:
    """One line per failed setting: ``name: why`` (just ``why`` for a check across fields)."""
    lines = []
    for error in exc.errors(include_url=False):
        why = str(error.get("msg", "")).removeprefix("Value error, ")
        where = ".".join(str(part) for part in error.get("loc", ()))
        lines.append(f"{where}: {why}" if where else why)
    return lines
