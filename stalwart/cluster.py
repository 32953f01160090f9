"""A local Stalwart cluster: every service a process on loopback, one run folder for all.

``stalwart up`` (and the demo, tests and benchmarks) start, with :func:`start`:

- 2 coordinators sharing one ``shm://`` store (one leads, one is a hot standby);
- per shard group a paramserver primary, its backup(s) and a warm spare replica
  (the coordinator installs the spare as backup when a backup dies or hangs);
- N trainers and M warm standbys;
- with ``health=True`` (``stalwart up`` and the demo; off for test suites and
  benchmarks), the health service, which every trainer streams its telemetry to
  and whose alerts and risks the coordinators act on (``--health`` on both).

Everything goes under one run folder ``runs/<timestamp>/``: the state file
``cluster.json`` (names, roles, addresses, pids), and ``logs/<name>.log``.
``runs/latest`` points at the newest run. The processes live in their own
sessions, so they outlive ``stalwart up``; ``stalwart down`` reads the state
file and stops them (:func:`stop_run`). The library never imports the services:
it starts them as ``python -m services.<role>``, or (``ClusterConfig.launcher``,
what ``stalwart up`` does) forks each from the run's detached launcher
(:class:`stalwart.procs.Launcher`, ``logs/launcher.log``, recorded in the state
file), which imported torch once for all of them and is stopped last by ``down``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from stalwart import meminfo
from stalwart.api import coordinator
from stalwart.client.coordinator import CoordinatorClient
from stalwart.errors import RpcError
from stalwart.procs import (
    Launcher,
    ServiceProcess,
    ServiceStartError,
    process_start_ticks,
    start_service,
)

STATE_FILE = "cluster.json"
LATEST = "latest"
DEFAULT_RUNS_ROOT = Path("runs")
SHM_ROOT = Path("/dev/shm/stalwart")

# Short shutdown grace: a local cluster should stop in seconds, and trainers
# only need to finish one step.
_COMMON_FLAGS = ("--grace-seconds", "3")
PARAMSERVER_MEMORY_SHARE = 4  # each paramserver's budget: 1/4 of the machine (paramserver_budget)

MODULES = {
    "coordinator": "services.coordinator",
    "paramserver": "services.paramserver",
    "trainer": "services.trainer",
    "health": "services.health",
}


class ClusterError(RuntimeError):
    """A cluster could not be started, found or stopped; the message says why."""


@dataclass(frozen=True)
class Host:
    """A host of its own for one member: a network namespace and the address it has there."""

    netns: str
    """Name given to ``ip netns add``."""
    ip: str
    """The member binds and advertises this address (plaintext: a private test network)."""


@dataclass(frozen=True)
class ClusterConfig:
    """What to start. Every field has the default ``stalwart up`` uses."""

    trainers: int = 3
    """Trainers that take slots."""
    standbys: int = 1
    """Warm standby trainers (hold weights, take a dead trainer's slot)."""
    shards: int = 1
    """Paramserver shard groups."""
    backups: int = 1
    """Backups per shard group (each group also has a primary)."""
    spares: int = 1
    """Warm spare paramserver replicas per shard group: registered, holding no state
    until the coordinator installs one as backup in the place of a dead or hung one."""
    coordinators: int = 2
    """Coordinator replicas (one leader, the rest hot standbys)."""
    store_url: str = ""
    """Coordination store; empty: a fresh ``shm:///dev/shm/stalwart/<run>[-n]``, removed by down."""
    runs_root: Path = DEFAULT_RUNS_ROOT
    """Where run folders are made (``<runs_root>/<timestamp>``, ``<runs_root>/latest``)."""
    run_dir: Path | None = None
    """Use this run folder instead of a new timestamped one."""
    start_timeout_s: float = 120.0
    """Longest one process may take to serve (imports are slow on a loaded machine)."""
    extra_args: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """More flags per role (``coordinator``, ``paramserver``, ``trainer``), e.g. timings."""
    member_args: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """More flags for one member by name, e.g. the demo's heating ``trainer-0``."""
    trainer_env: dict[str, str] = field(default_factory=dict)
    """Environment added to trainers (tests set ``STALWART_FAULTS`` through it)."""
    paramserver_memory_bytes: int | None = None
    """Each paramserver's ``--memory-budget-bytes``. None: a quarter of this machine's
    memory (``PARAMSERVER_MEMORY_SHARE``); 0: no budget, the memory free at each
    registration, which every service on the machine counts as its own."""
    health: bool = False
    """Start the health service and wire coordinators and trainers to it. ``stalwart up``
    and ``stalwart demo`` turn it on (``--no-health`` opts out); the library default stays
    off so test clusters and benchmarks keep their shape and figures."""
    device: str = "auto"
    """Trainers' ``--device`` (stalwart/devices.py): with auto or cuda, trainer i (standbys
    numbered after the trainers) takes GPU i modulo the GPUs visible."""
    preload_services: bool = False
    """Fork services from a server with torch imported that dies with this process
    (test suites; see :mod:`stalwart.procs`)."""
    launcher: bool = False
    """Fork services from a detached launcher with torch imported that outlives this
    process (``stalwart up``; :class:`stalwart.procs.Launcher`): one per run, recorded in
    the state file, stopped after the members. ``preload_services`` wins over it."""
    stop_with_caller: bool = False
    """With ``launcher``: once the process that started the cluster has exited, however
    it ended (SIGTERM from ``timeout``, kill -9, out of memory), the launcher stops every
    service and removes the run's own store. Benchmarks and the demo set it, so a run
    cut short leaves no cluster training on; ``stalwart up``'s cluster outlives ``up``."""
    hosts: Mapping[str, Host] = field(default_factory=dict)
    """Members (by name) that run on a host of their own instead of loopback: tests of
    network faults cut and partition these hosts' links."""


@dataclass
class Member:
    """One process of the cluster, as written to the state file."""

    name: str
    role: str  # coordinator | paramserver | trainer | health
    address: str
    pid: int
    log: str
    shard: int = -1  # paramservers: their group
    started_as: str = ""  # paramservers: primary | backup; trainers: slot | standby
    local_index: int = -1  # trainers: position among this machine's trainers (GPU choice)
    start_ticks: int = 0  # the process's start time (/proc stat), to know it after a pid reuse


@dataclass
class LocalCluster:
    """A started cluster. Processes are held here when this process started them."""

    run_dir: Path
    store_url: str
    owns_store: bool
    members: list[Member] = field(default_factory=list)
    procs: dict[str, ServiceProcess] = field(default_factory=dict)
    config: ClusterConfig = field(default_factory=ClusterConfig)
    started_at: float = field(default_factory=time.time)
    stopped_at: float | None = None
    launcher: Launcher | None = None
    """The run's detached launcher, if it has one (``ClusterConfig.launcher``)."""
    specs: dict[str, _Spec] = field(default_factory=dict)
    """How each member this process started was started (for ``restart``)."""

    # --- what is where -----------------------------------------------------------

    @property
    def log_dir(self) -> Path:
        return self.run_dir / "logs"

    def of_role(self, role: str) -> list[Member]:
        return [m for m in self.members if m.role == role]

    @property
    def coordinator_addresses(self) -> list[str]:
        # a stand-in coordinator reuses its predecessor's address: list it once
        return list(dict.fromkeys(m.address for m in self.of_role("coordinator")))

    @property
    def health_address(self) -> str:
        """The health service's address ("" when the cluster runs without one)."""
        found = self.of_role("health")
        return found[-1].address if found else ""

    def paramserver_addresses(self, shard: int) -> list[str]:
        return [m.address for m in self.of_role("paramserver") if m.shard == shard]

    def member(self, name: str) -> Member:
        for m in self.members:
            if m.name == name:
                return m
        raise ClusterError(f"no member named {name!r} in {self.run_dir}")

    def by_address(self, address: str) -> Member:
        """The member serving at ``address``: a stand-in reuses a dead member's address,
        so the newest live one wins (the dead one only if none is alive)."""
        matches = [m for m in reversed(self.members) if m.address == address]
        for m in matches:
            if self.alive(m.name):
                return m
        if matches:
            return matches[0]
        raise ClusterError(f"no member at {address} in {self.run_dir}")

    # --- faults and repairs --------------------------------------------------------

    def kill(self, name: str) -> None:
        """kill -9 the member's process group: a crash, no goodbye."""
        proc = self.procs.get(name)
        if proc is not None:
            proc.kill()
        else:
            _signal_group(self.member(name).pid, signal.SIGKILL)

    def pause(self, name: str) -> None:
        """SIGSTOP the member's process group: a hung process (GC pause, starved VM)."""
        _signal_group(self.member(name).pid, signal.SIGSTOP)

    def resume(self, name: str) -> None:
        """SIGCONT a paused member."""
        _signal_group(self.member(name).pid, signal.SIGCONT)

    def alive(self, name: str) -> bool:
        proc = self.procs.get(name)
        return proc.alive() if proc is not None else _is_ours(self.member(name))

    def replace(self, name: str) -> Member:
        """Start a stand-in for a dead member, as an operator (or Kubernetes) would.

        A coordinator comes back on the same port, so the address lists every node
        was given stay valid; a paramserver comes back as a backup of its group
        (the coordinator attaches it to the primary); a trainer comes back as a
        warm standby. The stand-in gets a new name (and node id).
        """
        dead = self.member(name)
        if self.alive(name):
            raise ClusterError(f"{name} is still running")
        n = sum(1 for m in self.members if m.name.startswith(f"{name}.")) + 1
        new = f"{name}.{n}"
        if dead.role == "coordinator":
            spec = _coordinator_spec(new, self.store_url, self.config, self.health_address)
            same_port = _Spec(
                new, spec.role, (*spec.args, "--port", dead.address.rsplit(":", 1)[1])
            )
            try:
                member = self._start(same_port)
            except ServiceStartError:
                # The port can be taken meanwhile (loopback clients get ephemeral
                # ports from the same range). A new address still works: nodes
                # follow the leader's address hints from the replicas they know.
                member = self._start(spec)
            self.save()
            return member
        if dead.role == "health":  # same port: coordinators and trainers keep dialling it
            port = dead.address.rsplit(":", 1)[1]
            spec = _health_spec(new, self.coordinator_addresses, port)
        elif dead.role == "paramserver":
            spec = _paramserver_spec(new, dead.shard, [], self.coordinator_addresses, True)
        else:
            spec = _trainer_spec(
                new,
                self.coordinator_addresses,
                True,
                self.config,
                max(dead.local_index, 0),
                self.health_address,
            )  # its GPU is free now
        member = self._start(spec)
        self.save()
        return member

    def restart(self, name: str) -> Member:
        """Start a dead member again under its own name, node id and port with its
        start-up flags, as a supervisor would (compose's ``restart: unless-stopped``):
        the new process has lost its memory and claims what the flags say."""
        dead = self.member(name)
        if self.alive(name):
            raise ClusterError(f"{name} is still running")
        spec = self.specs.get(name)
        if spec is None:
            raise ClusterError(f"{name} was not started by this process: its flags are unknown")
        port = dead.address.rsplit(":", 1)[1]
        same_port = dataclasses.replace(spec, args=(*spec.args, "--port", port))
        self.members.remove(dead)  # the name now stands for the new process
        try:
            member = self._start(same_port)
        except ServiceStartError:
            self.members.append(dead)
            raise
        self.specs[name] = spec  # its own flags, not one more --port per restart
        self.save()
        return member

    # --- life cycle ----------------------------------------------------------------

    def _start(self, spec: _Spec) -> Member:
        budget = paramserver_budget(self.config) if spec.role == "paramserver" else 0
        args = [*_COMMON_FLAGS, "--node-id", spec.name, *spec.args,
                *(["--memory-budget-bytes", str(budget)] if budget else []),
                *self.config.extra_args.get(spec.role, ()),
                *self.config.member_args.get(spec.name, ())]  # fmt: skip
        host = self.config.hosts.get(spec.name)
        if host is not None:
            args += ["--host", host.ip, "--insecure"]
        launcher = self.launcher
        if launcher is not None and not launcher.alive():
            launcher = None  # a later command after the launcher died: a fresh interpreter
        proc = start_service(MODULES[spec.role], args, self.log_dir, spec.name, env=spec.env,
                             timeout=self.config.start_timeout_s, cwd=_repo_root(),
                             preload=self.config.preload_services,
                             netns=host.netns if host else None, launcher=launcher)  # fmt: skip
        self.procs[spec.name] = proc
        self.specs[spec.name] = spec
        member = Member(spec.name, spec.role, proc.address, proc.pid, str(proc.log_path),
                        spec.shard, spec.started_as, spec.local_index,
                        process_start_ticks(proc.pid) or 0)  # fmt: skip
        self.members.append(member)
        return member

    def _start_all(self, specs: Sequence[_Spec], pool: ThreadPoolExecutor) -> list[Member]:
        return list(pool.map(self._start, specs))

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM every process at once, SIGKILL what is left after ``timeout_s``."""
        stop_members(self.members, timeout_s)
        for proc in self.procs.values():
            if proc.alive():
                proc.kill()
            else:
                proc.popen.poll()  # reap
        if self.launcher is not None:
            self.launcher.stop()
        self.stopped_at = time.time()
        self.save()
        if self.owns_store:
            remove_store(self.store_url)

    def save(self) -> None:
        data = {
            "run_dir": str(self.run_dir),
            "store_url": self.store_url,
            "owns_store": self.owns_store,
            "started_at": self.started_at,
            "stopped_at": self.stopped_at,
            "members": [asdict(m) for m in self.members],
            "launcher": asdict(self.launcher) if self.launcher else None,
        }
        tmp = self.run_dir / f".{STATE_FILE}.tmp"
        tmp.write_text(json.dumps(data, indent=2))
        tmp.replace(self.run_dir / STATE_FILE)  # readers never see half a file

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass(frozen=True)
class _Spec:
    name: str
    role: str
    args: tuple[str, ...]
    shard: int = -1
    started_as: str = ""
    env: dict[str, str] | None = None
    local_index: int = -1


def _coordinator_spec(name: str, store_url: str, config: ClusterConfig, health: str = "") -> _Spec:
    args = ("--store-url", store_url)
    if config.spares:  # the primary keeps `backups` backups; the rest are spares
        args += ("--paramserver-backups", str(config.backups))
    if health:
        args += ("--health", health)
    return _Spec(name, "coordinator", args)


def _health_spec(name: str, coordinators: list[str], port: str) -> _Spec:
    return _Spec(name, "health", ("--coordinator", ",".join(coordinators), "--port", port))


def paramserver_budget(config: ClusterConfig, total: int | None = None) -> int:
    """The ``--memory-budget-bytes`` each paramserver of a local cluster gets (0: none).

    Every service of a local cluster shares one machine, and without a budget each
    paramserver checks a new job against the memory free at that moment, which its
    replicas and the trainers count as theirs too: a job of 1,000 slots passed the
    check on a 24 GiB machine and the OOM killer ended the primary, then a trainer.
    A quarter of the machine each leaves room for a group's primary, backup and spare
    holding the same job (``total``: the machine's memory, for tests)."""
    if config.paramserver_memory_bytes is not None:
        return config.paramserver_memory_bytes
    total = meminfo.total_bytes() if total is None else total
    return total // PARAMSERVER_MEMORY_SHARE if total < sys.maxsize else 0


def _paramserver_spec(
    name: str, shard: int, backups: list[str], coordinators: list[str], backup: bool
) -> _Spec:
    args = ["--role", "backup" if backup else "primary", "--shard", str(shard),
            "--coordinator", ",".join(coordinators)]  # fmt: skip
    if backups:
        args += ["--backups", ",".join(backups)]
    return _Spec(name, "paramserver", tuple(args), shard, "backup" if backup else "primary")


def _trainer_spec(
    name: str,
    coordinators: list[str],
    standby: bool,
    config: ClusterConfig,
    index: int,
    health: str = "",
) -> _Spec:
    args = ["--coordinator", ",".join(coordinators), "--device", config.device,
            "--local-index", str(index)] + (["--standby"] if standby else [])  # fmt: skip
    args += ["--health", health] if health else []
    return _Spec(name, "trainer", tuple(args), -1, "standby" if standby else "slot",
                 dict(config.trainer_env) or None, index)  # fmt: skip


# --- starting ---------------------------------------------------------------------------


def new_run_dir(runs_root: Path) -> Path:
    """``<runs_root>/<UTC timestamp>`` (made), and ``<runs_root>/latest`` pointing at it."""
    runs_root = Path(runs_root)
    runs_root.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    run_dir = runs_root / stamp
    n = 1
    while run_dir.exists():  # two runs in one second
        run_dir = runs_root / f"{stamp}-{n}"
        n += 1
    run_dir.mkdir()
    point_latest(runs_root, run_dir)
    return run_dir


def point_latest(runs_root: Path, run_dir: Path) -> None:
    link = Path(runs_root) / LATEST
    tmp = Path(runs_root) / f".{LATEST}.{os.getpid()}"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(run_dir.name)  # relative: the runs folder can move
    tmp.replace(link)


def start(config: ClusterConfig | None = None) -> LocalCluster:
    """Start a whole cluster and return once every process serves.

    Processes start in parallel where they can (the imports, not the work,
    dominate start-up): the coordinators first; then every paramserver backup,
    trainer and standby together; each primary as soon as its backups serve.
    On any failure, what was started is stopped and ClusterError says why.
    """
    config = config or ClusterConfig()
    if (config.trainers < 0 or config.standbys < 0 or config.shards < 1 or config.backups < 0
            or config.spares < 0):  # fmt: skip
        raise ClusterError(
            "need trainers >= 0, standbys >= 0, shards >= 1, backups >= 0, spares >= 0"
        )
    if config.coordinators < 1:
        raise ClusterError("need at least one coordinator")
    run_dir = Path(config.run_dir) if config.run_dir else new_run_dir(config.runs_root)
    run_dir.mkdir(parents=True, exist_ok=True)
    owns_store = not config.store_url
    store_dir = None if config.store_url else reserve_store_dir(run_dir.name)
    store_url = config.store_url or f"shm://{store_dir}"
    cluster = LocalCluster(run_dir.resolve(), store_url, owns_store, config=config)
    cluster.save()
    try:
        if config.launcher and not config.preload_services:
            owner = os.getpid() if config.stop_with_caller else None
            cluster.launcher = Launcher.start(cluster.log_dir, timeout=config.start_timeout_s,
                                              cwd=_repo_root(), owner=owner,
                                              owner_scratch=store_dir)  # fmt: skip
            cluster.save()  # recorded before it forks anything: down finds it either way
        _start_everything(cluster, config)
    except Exception as exc:
        cluster.stop(timeout_s=5)
        raise ClusterError(f"starting the cluster failed: {exc}") from exc
    except BaseException:  # interrupted (Ctrl-C, SIGTERM's unwind): nothing half-started
        cluster.stop(timeout_s=5)
        raise
    cluster.save()
    return cluster


def reserve_store_dir(name: str, root: Path = SHM_ROOT) -> Path:
    """Make ``root/name`` (``name-1``, ``name-2``, ... if taken) and return it: one run's
    own store directory, never another's.

    Run folders are unique only within their runs root, and every checkout, test and
    CI run has its own: two clusters started in the same second got the same
    ``/dev/shm/stalwart/<timestamp>``, shared one leader lease and epoch counter, and
    the first one stopped deleted the other's store under it (its nodes held epochs
    the restarted counter never issued). ``mkdir`` is atomic: two starts never get
    the same directory."""
    root.mkdir(parents=True, exist_ok=True)
    path, n = root / name, 0
    while True:
        try:
            path.mkdir()
            return path
        except FileExistsError:
            n += 1
            path = root / f"{name}-{n}"


def _start_everything(cluster: LocalCluster, config: ClusterConfig) -> None:
    workers = (config.coordinators + config.shards * (1 + config.backups + config.spares)
               + config.trainers)  # fmt: skip
    # The health service needs the coordinators' addresses (it registers with them) and
    # they need its address: its port is picked first, so it starts beside the nodes and
    # adds nothing to the coordinators' start. Both sides redial until the other serves.
    port = _free_port() if config.health else 0
    health = f"127.0.0.1:{port}" if port else ""
    with ThreadPoolExecutor(max_workers=max(4, workers + config.standbys + 1)) as pool:
        coord_specs = [
            _coordinator_spec(f"coord-{i}", cluster.store_url, config, health)
            for i in range(config.coordinators)
        ]
        coords = [m.address for m in cluster._start_all(coord_specs, pool)]
        nodes = [
            pool.submit(cluster._start, _health_spec("health", coords, str(port)))
        ] if port else []  # fmt: skip
        nodes += [
            pool.submit(cluster._start,
                        _trainer_spec(f"trainer-{i}", coords, False, config, i, health))
            for i in range(config.trainers)
        ]  # fmt: skip
        nodes += [
            pool.submit(cluster._start, _trainer_spec(f"standby-{i}", coords, True, config,
                                                      config.trainers + i, health))  # fmt: skip
            for i in range(config.standbys)
        ]  # fmt: skip
        groups = [
            pool.submit(_start_group, cluster, shard, config, coords, pool)
            for shard in range(config.shards)
        ]
        for future in [*groups, *nodes]:
            future.result()  # raises the first failure
    # state-file order: coordinators, paramservers, trainers (threads finish in any order)
    order = {"coordinator": 0, "paramserver": 1, "trainer": 2, "health": 3}
    cluster.members.sort(key=lambda m: (order[m.role], m.shard, m.name))


def _start_group(
    cluster: LocalCluster, shard: int, config: ClusterConfig, coords: list[str],
    pool: ThreadPoolExecutor,
) -> None:  # fmt: skip
    letters = "bcdefghijklmnopqrstuvwxyz"
    specs = [
        _paramserver_spec(f"ps-{shard}{letters[i]}", shard, [], coords, True)
        for i in range(config.backups + config.spares)
    ]
    started = cluster._start_all(specs, pool) if specs else []
    backups = [m.address for m in started[: config.backups]]  # the rest are spares
    cluster._start(_paramserver_spec(f"ps-{shard}a", shard, backups, coords, False))


def _free_port() -> int:
    """A loopback port free right now (the health service binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _repo_root() -> Path | None:
    """The checkout holding ``services/`` next to ``stalwart/``, if this is one."""
    root = Path(__file__).resolve().parents[1]
    return root if (root / "services").is_dir() else None


# --- finding and stopping a cluster started earlier ---------------------------------------


def load(run_dir: Path) -> LocalCluster:
    """The cluster a run folder's state file describes (no process handles)."""
    path = Path(run_dir) / STATE_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ClusterError(f"no cluster state in {run_dir} ({STATE_FILE} missing)") from None
    except json.JSONDecodeError as exc:
        raise ClusterError(f"{path} is not valid JSON: {exc}") from None
    launcher = data.get("launcher")
    return LocalCluster(
        Path(data["run_dir"]), data["store_url"], data.get("owns_store", False),
        [Member(**m) for m in data.get("members", [])],
        started_at=data.get("started_at", 0.0), stopped_at=data.get("stopped_at"),
        launcher=Launcher(**launcher) if launcher else None,
    )  # fmt: skip


def find_run(run_dir: Path | None = None, runs_root: Path = DEFAULT_RUNS_ROOT) -> Path:
    """``run_dir`` if given, else the folder ``<runs_root>/latest`` points at."""
    if run_dir is not None:
        return Path(run_dir)
    link = Path(runs_root) / LATEST
    if not link.exists():
        raise ClusterError(f"no local cluster: {link} does not exist (start one: stalwart up)")
    return link.resolve()


def live_run(runs_root: Path = DEFAULT_RUNS_ROOT) -> LocalCluster | None:
    """The cluster ``<runs_root>/latest`` describes, if any of its processes still runs:
    a second ``up`` would move ``latest`` away from it, and no ``down`` would reach it."""
    link = Path(runs_root) / LATEST
    if not link.exists():
        return None
    try:
        cluster = load(link.resolve())
    except ClusterError:  # a run that never got as far as its state file
        return None
    return cluster if any(_is_ours(m) for m in cluster.members) else None


def stop_run(run_dir: Path, timeout_s: float = 15.0) -> tuple[LocalCluster, int]:
    """Stop the processes a state file lists that are still ours; mark it stopped.
    Returns the cluster and how many of its processes were still running."""
    cluster = load(run_dir)
    running = stop_members(cluster.members, timeout_s)
    if cluster.launcher is not None:  # last: a member it forked is not its business now
        cluster.launcher.stop()
    cluster.stopped_at = time.time()
    cluster.run_dir = Path(run_dir).resolve()
    cluster.save()
    if cluster.owns_store:
        remove_store(cluster.store_url)
    return cluster, running


def stop_members(members: Sequence[Member], timeout_s: float) -> int:
    """SIGTERM (graceful) to each live member, then SIGKILL whatever outlives ``timeout_s``;
    returns how many were live.

    Trainers first, coordinators last, but without waiting in between: all get
    the signal within milliseconds and shut down in parallel.
    """
    order = {"trainer": 0, "health": 1, "paramserver": 1, "coordinator": 2}
    live = [m for m in sorted(members, key=lambda m: order.get(m.role, 3)) if _is_ours(m)]
    for m in live:
        _signal_group(m.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(_is_ours(m) for m in live):
        time.sleep(0.05)
    for m in live:
        if _is_ours(m):
            _signal_group(m.pid, signal.SIGKILL)
    return len(live)


def _is_ours(member: Member) -> bool:
    """Alive and still the process we started (a pid can be reused after it exits).

    Known by its start time; a service forked from the preloading server
    (stalwart.procs) keeps that server's command line, so the command line only
    decides for state files written before start times were recorded."""
    ticks = process_start_ticks(member.pid)  # None: gone, or a zombie that has exited
    if ticks is None:
        return False
    if member.start_ticks:
        return ticks == member.start_ticks
    try:
        cmdline = Path(f"/proc/{member.pid}/cmdline").read_bytes().split(b"\0")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    return member.name.encode() in cmdline and MODULES[member.role].encode() in cmdline


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)  # each service leads its own session/group
    except (ProcessLookupError, PermissionError):
        pass


def remove_store(store_url: str) -> None:
    """Delete a run's own shm:// store directory (only ever one under /dev/shm/stalwart)."""
    parsed = urlparse(store_url)
    path = Path(parsed.path)
    if parsed.scheme == "shm" and path.parent == SHM_ROOT:
        shutil.rmtree(path, ignore_errors=True)


# --- waiting for it to be whole -----------------------------------------------------------


async def wait_healthy(cluster: LocalCluster, timeout_s: float = 60.0) -> None:
    """Return once a coordinator leads and every live member of the cluster is registered
    and alive in its membership; ClusterError after ``timeout_s``.

    Nodes register right after they serve, but a trainer that is not yet known
    cannot take a slot, so jobs submitted before this could start short-handed.
    """
    expected = {
        m.name for m in cluster.members if m.role != "coordinator" and cluster.alive(m.name)
    }
    deadline = time.monotonic() + timeout_s
    missing: set[str] = expected
    async with CoordinatorClient(
        cluster.coordinator_addresses, call_timeout_s=2.0, retry_for_s=2.0
    ) as client:
        while time.monotonic() < deadline:
            try:
                nodes = await client.all_nodes()
            except RpcError:
                nodes = []  # no leader yet
            alive = {n.node_id for n in nodes if n.state == coordinator.NODE_STATE_ALIVE}
            missing = expected - alive
            if not missing:
                return
            await asyncio.sleep(0.2)
    raise ClusterError(
        f"not every node registered within {timeout_s:.0f}s: missing {sorted(missing)}"
    )
