"""The coordinator's state in the coordination store, written only under its epoch.

Keys (under an optional prefix, so several clusters can share one store):

    coordinator/leader      the leader lease (fencing token = coordinator epoch)
    coordinator/epoch       highest epoch that has taken over; only ever grows
    recoveries              JSON: the cluster's recovery counts by kind (the
                            stalwart_coordinator_recoveries_total the leader exports)
    jobs/<job_id>           serialized stalwart.v1.Job
    nodes/<node_id>         serialized stalwart.v1.Node
    groups/<shard>          JSON: recorded primary node id and epoch of a shard group
                            (and the primary's process instance, once polled);
                            "lost": true while every replica is gone (restore pending)
    checkpoints/<job_id>    JSON: how many checkpoints the job has taken (tiering)
    usererrors/<job_id>     JSON: the job's counts of user-code error reports
                            (taskerrors.TaskErrors.entries), while it is active
    requests/<hash>         job id admitted for a CreateJob request id, then
                            "\nadmitted" once the job's record is stored
    answers/<hash>          what another mutating call answered for its request id
                            (a job, node or checkpoint id, an epoch): a retry gets it
                            (both prefixed "<unix seconds>\n" and deleted once older
                            than the retention, so retries are honoured for a day by
                            default and the keys do not pile up forever)
    events/<sequence>       serialized stalwart.v1.Event, the newest N kept

Fencing: a new leader raises ``coordinator/epoch`` to its own epoch (CAS, never
down) before it writes anything. Every later write first checks that the key
still holds the writer's epoch, so a deposed leader that wakes up finds a
higher one and is refused (:class:`Fenced`). The stores have no multi-key
transactions; the remaining window (check, then write) is covered by the
leader's local lease deadline, checked before every decision (see leader.py).

Blocking: call these from a worker thread, never on the event loop.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from stalwart.api import common, coordinator
from stalwart.errors import StalwartError
from stalwart.stores import Store
from stalwart.stores.common import MAX_KEY_CHARS, check_key

LEASE_NAME = "coordinator/leader"
EPOCH_KEY = "coordinator/epoch"
RECOVERIES_KEY = "recoveries"
# The longest prefix every fixed key still fits under (store keys are at most
# MAX_KEY_CHARS): 181, set by "<prefix>/coordinator/leader".
MAX_PREFIX_CHARS = MAX_KEY_CHARS - 1 - max(map(len, (LEASE_NAME, EPOCH_KEY, RECOVERIES_KEY)))
REQUEST_RETENTION_S = 24 * 3600.0  # how long a request id's answer is kept for retries
ADMITTED = b"\nadmitted"  # ends a request's job id once the job's record is stored


class Fenced(Exception):
    """A newer coordinator epoch owns the store: this replica must stop acting."""

    def __init__(self, mine: int, stored: int) -> None:
        super().__init__(f"coordinator epoch {mine} is fenced by {stored}")
        self.mine = mine
        self.stored = stored


def check_prefix(prefix: str) -> str:
    """``prefix`` if every key of the state fits under it; ValueError saying why not.

    Checked when the settings are parsed: a prefix too long makes an invalid
    leader lease name on every store, found otherwise only by each election. The
    rule is the stores' own (``check_key``) applied to the longest fixed key."""
    n = len(prefix.strip("/"))
    if n > MAX_PREFIX_CHARS:
        raise ValueError(
            f"store prefix is {n} characters, at most {MAX_PREFIX_CHARS}: store keys are at "
            f"most {MAX_KEY_CHARS} and the leader lease's is '<prefix>/{LEASE_NAME}'"
        )
    try:
        check_key("lease name", StateStore(None, prefix).lease_name)
    except StalwartError:
        raise ValueError(
            f"store prefix {prefix[:40]!r} may hold only A-Z a-z 0-9 . _ : @ = + - / "
            "(not starting with '.', no '//')"
        ) from None
    return prefix


@dataclass(frozen=True)
class GroupRecord:
    """A shard group as stored (``groups/<shard>``)."""

    primary: str  # the recorded primary's node id
    epoch: int
    lost: bool = False  # every replica gone; a restore is pending
    instance: str = ""  # the primary's process (GetReplicaStatus.instance), once polled


@dataclass(frozen=True)
class RequestRecord:
    """What a CreateJob request id is remembered with (``requests/<hash>``)."""

    job_id: str
    admitted: bool  # the job's record was stored (request_admitted)


class StateStore:
    def __init__(
        self,
        store: Store,
        prefix: str = "",
        retention_s: float = REQUEST_RETENTION_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.retention_s = retention_s
        self.clock = clock  # wall clock: the stamps outlive this process
        # (stamp, key) of every held request id in the order written, so expiring them
        # pops from the front instead of listing them all; listed once per epoch.
        self._request_ids: deque[tuple[float, str]] = deque()
        self._request_ids_epoch: int | None = None
        self._events_kept_above: int | None = None  # events at or below it are deleted

    def key(self, name: str) -> str:
        return self.prefix + name

    @property
    def lease_name(self) -> str:
        return self.key(LEASE_NAME)

    # --- fencing -------------------------------------------------------------------

    def stored_epoch(self) -> int:
        raw = self.store.kv_get(self.key(EPOCH_KEY))
        return int(raw) if raw else 0

    def take_over(self, epoch: int) -> None:
        """Raise the stored epoch to ``epoch``; Fenced if a higher one is there already."""
        self._events_kept_above = None  # other leaders may have trimmed since our last term
        key = self.key(EPOCH_KEY)
        for _ in range(100):  # CAS loop: only contention from other takeovers
            raw = self.store.kv_get(key)
            stored = int(raw) if raw else 0
            if stored > epoch:
                raise Fenced(epoch, stored)
            if stored == epoch or self.store.kv_cas(key, raw, str(epoch).encode()):
                return
        raise Fenced(epoch, self.stored_epoch())

    def check(self, epoch: int) -> None:
        stored = self.stored_epoch()
        if stored != epoch:
            raise Fenced(epoch, stored)

    # --- fenced writes -------------------------------------------------------------

    def put_job(self, epoch: int, job: coordinator.Job) -> None:
        self.check(epoch)
        self.store.kv_put(self.key(f"jobs/{job.job_id}"), job.SerializeToString())

    def put_node(self, epoch: int, node: coordinator.Node) -> None:
        self.check(epoch)
        self.store.kv_put(self.key(f"nodes/{node.node_id}"), node.SerializeToString())

    def delete_node(self, epoch: int, node_id: str) -> None:
        self._put_or_drop(epoch, f"nodes/{node_id}", None)

    def delete_job(self, epoch: int, job_id: str) -> None:
        """A forgotten job's record and its checkpoint count (its checkpoints stay)."""
        self._put_or_drop(epoch, f"jobs/{job_id}", None)
        self._put_or_drop(epoch, f"checkpoints/{job_id}", None)

    def put_group(
        self,
        epoch: int,
        shard: int,
        primary_id: str,
        group_epoch: int,
        lost: bool = False,
        instance: str = "",
    ) -> None:
        self.check(epoch)
        record: dict = {"primary": primary_id, "epoch": group_epoch}
        if lost:
            record["lost"] = True
        if instance:  # the primary's process (GetReplicaStatus.instance)
            record["instance"] = instance
        self.store.kv_put(self.key(f"groups/{shard}"), json.dumps(record).encode())

    def put_checkpoint_count(self, epoch: int, job_id: str, taken: int) -> None:
        self.check(epoch)
        self.store.kv_put(self.key(f"checkpoints/{job_id}"), json.dumps({"taken": taken}).encode())

    def checkpoint_count(self, job_id: str) -> int:
        raw = self.store.kv_get(self.key(f"checkpoints/{job_id}"))
        return int(json.loads(raw)["taken"]) if raw else 0

    def put_recoveries(self, epoch: int, counts: dict[str, int]) -> None:
        self.check(epoch)
        self.store.kv_put(self.key(RECOVERIES_KEY), json.dumps(counts, sort_keys=True).encode())

    def recoveries(self) -> dict[str, int]:
        raw = self.store.kv_get(self.key(RECOVERIES_KEY))
        return {str(k): int(v) for k, v in json.loads(raw).items()} if raw else {}

    def put_task_errors(self, epoch: int, job_id: str, entries: list | None) -> None:
        """A job's user-error counts (plain data); None or empty drops them."""
        value = json.dumps(entries).encode() if entries else None
        self._put_or_drop(epoch, f"usererrors/{job_id}", value)

    def task_errors(self) -> dict[str, list]:
        items = self.store.kv_list(self.key("usererrors/")).items()
        return {k.rsplit("/", 1)[1]: json.loads(v) for k, v in items}

    def _put_or_drop(self, epoch: int, name: str, value: bytes | None) -> None:
        self.check(epoch)
        if value is None:
            self.store.kv_delete(self.key(name))
        else:
            self.store.kv_put(self.key(name), value)

    def put_request(self, epoch: int, request_id: str, job_id: str) -> str:
        """Remember which job a request admits, before its record is stored; returns
        the job id stored first."""
        stored = self._remember_once(epoch, f"requests/{_hash(request_id)}", job_id.encode())
        return stored.removesuffix(ADMITTED).decode()

    def request_admitted(self, epoch: int, request_id: str, job_id: str) -> None:
        """Mark the request's job as stored. A retry that finds no such job then knows
        it was forgotten (--keep-finished-jobs) rather than lost to a crash between
        the two writes, and must not admit it again."""
        self.check(epoch)
        value = _stamp(self.clock(), job_id.encode() + ADMITTED)
        self.store.kv_put(self.key(f"requests/{_hash(request_id)}"), value)

    def put_answer(self, epoch: int, key: str, value: bytes) -> bytes:
        """Remember what the call ``key`` (method and request id) answered; returns the
        value stored first (a concurrent retry may have won)."""
        return self._remember_once(epoch, f"answers/{_hash(key)}", value)

    def answer(self, key: str) -> bytes | None:
        return self._recall(f"answers/{_hash(key)}")

    def _remember_once(self, epoch: int, name: str, value: bytes) -> bytes:
        self.check(epoch)
        self.trim_request_ids(epoch)
        key, now = self.key(name), self.clock()
        if self.store.kv_cas(key, None, _stamp(now, value)):
            self._request_ids.append((now, key))
            return value
        return self._recall(name) or value

    def _recall(self, name: str) -> bytes | None:
        raw = self.store.kv_get(self.key(name))
        return None if raw is None else _unstamp(raw)[1]

    def trim_request_ids(self, epoch: int) -> int:
        """Delete request ids (and their answers) older than the retention; returns how
        many. A retry after that runs again, as with any idempotency-key service.

        The first call under an epoch lists every held id (other leaders wrote some);
        after that only the ones this leader wrote are added, in order, so a call costs
        what it deletes, not what is held: listing them all on every few writes made
        the leader spend half its time listing once 20,000 jobs had come and gone."""
        if self._request_ids_epoch != epoch:
            self._request_ids = deque(sorted(self._listed_request_ids()))
            self._request_ids_epoch = epoch
        cutoff = self.clock() - self.retention_s
        deleted = 0
        # A wall clock stepped back leaves an id behind a younger one: it then goes
        # when that one does, late but not lost.
        while self._request_ids and self._request_ids[0][0] < cutoff:
            deleted += self.store.kv_delete(self._request_ids.popleft()[1])
        return deleted

    def _listed_request_ids(self) -> list[tuple[float, str]]:
        return [
            (_unstamp(raw)[0], key)
            for prefix in ("requests/", "answers/")
            for key, raw in self.store.kv_list(self.key(prefix)).items()
        ]

    def append_events(self, epoch: int, events: list[common.Event], keep: int) -> None:
        self.check(epoch)
        for event in events:
            self.store.kv_put(self.key(f"events/{event.sequence:020d}"), event.SerializeToString())
        if events and events[-1].sequence % 100 == 0:  # trim now and then, not every write
            self._trim_events(events[-1].sequence - keep)

    def _trim_events(self, below: int) -> None:
        """Delete the events with sequence <= ``below``. Listing reads every stored
        event (10,000 by default, each a file in a file store), so it happens once per
        leader; after that the keys to delete are named from their sequences."""
        if self._events_kept_above is None:
            for key in self.store.kv_list(self.key("events/")):
                if int(key.rsplit("/", 1)[1]) <= below:
                    self.store.kv_delete(key)
        else:
            for sequence in range(self._events_kept_above + 1, below + 1):
                self.store.kv_delete(self.key(f"events/{sequence:020d}"))
        self._events_kept_above = max(below, self._events_kept_above or 0)

    # --- reads ---------------------------------------------------------------------

    def request_job(self, request_id: str) -> RequestRecord | None:
        raw = self._recall(f"requests/{_hash(request_id)}")
        if not raw:
            return None
        return RequestRecord(raw.removesuffix(ADMITTED).decode(), raw.endswith(ADMITTED))

    def jobs(self) -> list[coordinator.Job]:
        return [_parse(coordinator.Job, v) for v in self.store.kv_list(self.key("jobs/")).values()]

    def nodes(self) -> list[coordinator.Node]:
        return [
            _parse(coordinator.Node, v) for v in self.store.kv_list(self.key("nodes/")).values()
        ]

    def groups(self) -> dict[int, GroupRecord]:
        """Every shard group's stored record, read in one listing."""
        out = {}
        for key, value in self.store.kv_list(self.key("groups/")).items():
            r = json.loads(value)
            out[int(key.rsplit("/", 1)[1])] = GroupRecord(
                r["primary"], int(r["epoch"]), bool(r.get("lost")), r.get("instance", "")
            )
        return out

    def events(self, after: int = 0) -> list[common.Event]:
        items = self.store.kv_list(self.key("events/"))
        out = [
            _parse(common.Event, v) for k, v in items.items() if int(k.rsplit("/", 1)[1]) > after
        ]
        return sorted(out, key=lambda e: e.sequence)

    def last_sequence(self) -> int:
        keys = self.store.kv_list(self.key("events/"))
        return max((int(k.rsplit("/", 1)[1]) for k in keys), default=0)


def _hash(request_id: str) -> str:
    # Request ids come from clients: hash them into the store's key alphabet.
    return hashlib.sha256(request_id.encode()).hexdigest()[:40]


def _stamp(at: float, value: bytes) -> bytes:
    return f"{int(at)}\n".encode() + value


def _unstamp(raw: bytes) -> tuple[float, bytes]:
    """(written at, value) of a stamped record."""
    at, _, value = raw.partition(b"\n")
    return float(at), value


def _parse(cls, raw: bytes):
    msg = cls()
    msg.ParseFromString(raw)
    return msg
