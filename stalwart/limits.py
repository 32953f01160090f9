"""Hard limits on what a request may carry: one table, read by validation and by servers.

Every string a service stores (and so serves back forever) has a length limit
here, and every map a count limit. Each server's largest accepted message is
derived from the same table (:func:`max_request_bytes`), set as gRPC's receive
limit, so a request too big to be valid is refused by gRPC with
RESOURCE_EXHAUSTED before it is parsed or reaches a handler. Tensor traffic
(paramserver streams) is bounded separately by ``--max-message-bytes`` and
:class:`stalwart.codec.Limits`.

No grpc, no torch: validation code anywhere can import it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from stalwart.errors import ErrorKind, StalwartError

KIB = 1024

# --- strings and maps a service stores -----------------------------------------------

MAX_ID = 128  # node ids, checkpoint ids, request ids (job ids: 63, stalwart.jobspec)
MAX_ADDRESS = 200  # host:port
MAX_REASON = 1024  # cancel / drain reasons, job failure reasons, report messages
MAX_MODEL_NAME = 256  # "package.module:function"
MAX_DATASET = 256
MAX_MAP_ENTRIES = 64  # labels, model_args, telemetry metrics
MAX_MAP_KEY = 128
MAX_MAP_VALUE = 1024
MAX_LOCATION = 512  # "file.py:123 in function" of a user error

# --- what one server holds open at once ---------------------------------------------

MAX_WATCHERS = 1000  # watch streams per server: each holds a call and a queue of items
MAX_PUSH_STREAMS = 1000  # PushStream calls per paramserver: a trainer holds one per replica
# ReplicateStream calls per backup: its primary holds one; the rest is room for a
# primary's new stream while its old one, or a deposed primary's, has not ended yet
MAX_REPLICATION_STREAMS = 64

# --- whole requests --------------------------------------------------------------------

# The largest valid request of each non-tensor service fits with room to spare:
# a JobSpec at every limit above is under 150 KiB (tests/unit/test_limits.py).
MAX_REQUEST_BYTES: Mapping[str, int] = {
    "stalwart.v1.CoordinatorService": 256 * KIB,
    "stalwart.v1.TrainerService": 64 * KIB,
    "stalwart.v1.HealthMonitorService": 1024 * KIB,
}


def max_request_bytes(service_names: Iterable[str], default: int) -> int:
    """gRPC receive limit of a server hosting ``service_names``: the table's limit of
    each (``default``, the configured message size, for a service without one, such as
    the paramserver, and as a cap), the largest wins."""
    sizes = [min(MAX_REQUEST_BYTES.get(name, default), default) for name in service_names]
    return max(sizes, default=default)


# --- checks ------------------------------------------------------------------------------


def check_string(field: str, value: str, limit: int) -> None:
    """LIMIT_EXCEEDED (RESOURCE_EXHAUSTED) when ``value`` is longer than ``limit``."""
    if len(value) > limit:
        raise StalwartError(
            ErrorKind.LIMIT_EXCEEDED, f"{field} is {len(value)} characters, limit {limit}"
        )


def check_open(what: str, held: int, limit: int, advice: str) -> None:
    """LIMIT_EXCEEDED when a server already holds ``limit`` of ``what`` open (watch
    streams, push streams, replication streams): each holds a call, a task and
    buffers, so their number is bounded like every other resource. ``advice``
    says what a refused client can do instead."""
    if held >= limit:
        raise StalwartError(
            ErrorKind.LIMIT_EXCEEDED,
            f"{held} {what} open already, the most one server serves; {advice}",
        )


def check_map(field: str, value: Mapping[str, object]) -> None:
    """Entry count, key and (string) value lengths of a stored map."""
    if len(value) > MAX_MAP_ENTRIES:
        raise StalwartError(
            ErrorKind.LIMIT_EXCEEDED, f"{field} has {len(value)} entries, limit {MAX_MAP_ENTRIES}"
        )
    for key, item in value.items():
        check_string(f"{field} key {key[:40]!r}", key, MAX_MAP_KEY)
        if isinstance(item, str):
            check_string(f"{field}[{key[:40]!r}]", item, MAX_MAP_VALUE)
