"""A handler whose call the server stopped under: no error logged, nothing answered."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc._cython import cygrpc
from structlog.testing import capture_logs

from stalwart.metrics import failure_code
from stalwart.server import rpc_handler


class _Context:
    answered = None

    async def abort_with_status(self, status) -> None:
        self.answered = status


def test_a_call_the_server_stopped_under_is_not_a_handler_error() -> None:
    """grpc raises its private _ServerStoppedError into a handler that reads a request
    stream after the server stopped; it was logged at error level with a traceback
    ("unexpected error in handler") and answered INTERNAL on a call already gone."""

    @rpc_handler
    async def stream_telemetry(request_iterator, context):
        raise cygrpc._ServerStoppedError("Server stopped.")

    context = _Context()
    with capture_logs() as logs, pytest.raises(cygrpc._ServerStoppedError):
        asyncio.run(stream_telemetry(iter(()), context))
    assert context.answered is None
    assert [e for e in logs if e["log_level"] in ("error", "critical")] == []


def test_a_bug_is_still_answered_internal_and_logged() -> None:
    @rpc_handler
    async def buggy(request, context):
        raise ZeroDivisionError("a bug")

    context = _Context()
    with capture_logs() as logs:
        asyncio.run(buggy(object(), context))
    assert context.answered is not None and "ZeroDivisionError" in context.answered.details
    assert [e["event"] for e in logs if e["log_level"] == "error"] == [
        "unexpected error in handler"
    ]


def test_the_metrics_count_a_call_the_server_stopped_under_as_cancelled() -> None:
    """The metrics and the bootstrap read "the call is gone" from one tuple: the
    stopped call was quiet in the log but counted UNKNOWN in the handled total."""
    stopped = cygrpc._ServerStoppedError("Server stopped.")
    assert failure_code(stopped, _Context()) == grpc.StatusCode.CANCELLED
    assert failure_code(asyncio.CancelledError(), _Context()) == grpc.StatusCode.CANCELLED
    assert failure_code(ZeroDivisionError(), _Context()) == grpc.StatusCode.UNKNOWN
