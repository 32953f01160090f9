"""structlog JSON logging, one line per event on stderr.

Every line carries ``service`` and ``node`` (fixed per process) plus whatever the
current task bound with :func:`bind` — the gRPC server (stalwart.instrument) binds
``rpc`` per call, handlers add ``job``/``step``/``slot``. Context lives in contextvars, so it
follows the asyncio task that serves one RPC and never leaks into another.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any

import structlog

_configured = False


class _Stderr:
    """Whatever ``sys.stderr`` is when a line is written, not when logging was set
    up: a harness that swaps it (pytest's capture) and closes the old one must not
    leave every later log line failing with "I/O operation on closed file"."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure_logging(level: str = "info", service: str = "stalwart", node_id: str = "") -> None:
    """Set up structlog (and stdlib logging) once per process; later calls do nothing."""
    global _configured
    if _configured:
        return
    _configured = True
    numeric = logging.getLevelNamesMapping()[level.upper()]
    static = {"service": service, "node": node_id}

    def add_static(_logger: Any, _name: str, event: MutableMapping[str, Any]) -> Any:
        for key, value in static.items():
            event.setdefault(key, value)
        return event

    shared = [
        structlog.contextvars.merge_contextvars,  # first: task context under explicit keys
        add_static,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(_Stderr()),
        cache_logger_on_first_use=True,
    )
    _route_stdlib(numeric, shared)


def _route_stdlib(level: int, shared: list[Any]) -> None:
    # grpc, asyncio and libraries log through stdlib logging; render them as the
    # same JSON lines so a log shipper sees one format.
    handler = logging.StreamHandler(_Stderr())
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                structlog.processors.JSONRenderer(),
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def get_logger(name: str | None = None, **initial: Any) -> Any:
    """A structlog logger; ``name`` lands in the ``logger`` key."""
    if name is not None:
        initial["logger"] = name
    # Bound after creation: get_logger(logger=...) would clash with its own parameter.
    return structlog.get_logger().bind(**initial)


def bind(**kv: Any) -> None:
    """Add keys (job=..., node=..., step=...) to every later line of the current task."""
    structlog.contextvars.bind_contextvars(**kv)


@contextmanager
def bound(**kv: Any) -> Iterator[None]:
    """Like :func:`bind`, for the duration of a ``with`` block only."""
    with structlog.contextvars.bound_contextvars(**kv):
        yield


def clear() -> None:
    """Drop every key bound in the current context (start of a new RPC)."""
    structlog.contextvars.clear_contextvars()
