"""Seeded fault schedules: which process to hit, how, and at which step of a job.

Pure code: a seed gives the same schedule on every machine, so a failing seed is
a reproducible bug report (`make chaos SEEDS=17`). The runner (runner.py) turns a
schedule into signals against a local cluster.

Each fault hits one role, resolved at fault time from what the cluster reports
(the slot trainer, the paramserver primary or its warm spare, the coordinator
leader, ...), with
kill -9 (a crash) or SIGSTOP for a few seconds (a hang, then the process goes on
as if nothing happened). Some faults bring a second one within a second, on a
role of another service, so that no group loses every replica at once; some
kill the stand-in started for a killed process as soon as it is up.

Restart schedules (``actions=RESTARTS``) kill -9 a process and start it again at
once under its own node id and port with its start-up flags, as a supervisor does
(`docker compose`'s ``restart: unless-stopped``, a pod's container restart): the new
process has lost its memory but claims what its flags say (a primary its group, a
slot trainer a slot).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

ROLES = ("trainer", "standby", "primary", "backup", "spare", "leader", "follower")
ACTIONS = ("kill", "stop")
RESTARTS = ("restart",)
#: Which service each role is a replica of: a second fault never hits the same one.
SERVICE_OF = {
    "trainer": "trainer",
    "standby": "trainer",
    "primary": "paramserver",
    "backup": "paramserver",
    "spare": "paramserver",
    "leader": "coordinator",
    "follower": "coordinator",
}
STOP_RANGE_S = (2.0, 8.0)
PAIR_WITHIN_S = 1.0
#: Where faults may fall, as fractions of the job: not before it runs, not at its end.
WINDOW = (0.15, 0.85)


@dataclass(frozen=True)
class Fault:
    at_step: int
    action: str  # kill | stop | restart; on network namespaces also cut | partition
    role: str
    stop_s: float = 0.0  # how long a SIGSTOP, cut link or partition lasts
    then: Fault | None = None  # a second fault, ``delay_s`` after this one
    delay_s: float = 0.0
    kill_stand_in: bool = False  # kill -9 the stand-in of a killed process once it serves

    def describe(self) -> str:
        what = f"{self.action} {self.role}" + (f" {self.stop_s:.1f}s" if self.stop_s else "")
        if self.kill_stand_in:
            what += ", then its stand-in"
        if self.then is not None:
            what += f" + {self.delay_s:.2f}s later {self.then.describe()}"
        return f"step {self.at_step}: {what}"


def schedule(
    seed: int,
    steps: int,
    faults: int = 3,
    roles: tuple[str, ...] = ROLES,
    actions: tuple[str, ...] = ACTIONS,
) -> list[Fault]:
    """``faults`` faults spread over the job's window, in step order."""
    rng = random.Random(seed)
    lo, hi = int(steps * WINDOW[0]), int(steps * WINDOW[1])
    span = (hi - lo) / faults
    out = []
    for i in range(faults):
        at = lo + int(span * i + rng.uniform(0.2, 0.8) * span)
        fault = _one(rng, at, roles, actions)
        if rng.random() < 0.25:
            others = tuple(r for r in roles if SERVICE_OF[r] != SERVICE_OF[fault.role])
            second = _one(rng, at, others, actions, allow_stand_in=False)
            fault = _with(fault, then=second, delay_s=round(rng.uniform(0, PAIR_WITHIN_S), 3))
        out.append(fault)
    return out


def _one(
    rng: random.Random, at: int, roles: tuple[str, ...], actions: tuple[str, ...],
    allow_stand_in=True,
) -> Fault:  # fmt: skip
    role = rng.choice(roles)
    action = rng.choice(actions)
    if action == "stop":
        return Fault(at, action, role, stop_s=round(rng.uniform(*STOP_RANGE_S), 2))
    if action == "restart":  # the same process comes back: there is no stand-in
        return Fault(at, action, role)
    return Fault(at, action, role, kill_stand_in=allow_stand_in and rng.random() < 0.2)


def _with(fault: Fault, **changes) -> Fault:
    return Fault(**{**fault.__dict__, **changes})


def parse_seeds(text: str) -> list[int]:
    """``"0-2,7"`` -> ``[0, 1, 2, 7]``; ValueError naming the bad part."""
    seeds: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        first, dash, last = part.partition("-")
        try:
            lo, hi = int(first), int(last) if dash else int(first)
        except ValueError:
            raise ValueError(f"bad seed range {part!r}: want N or N-M") from None
        if hi < lo:
            raise ValueError(f"bad seed range {part!r}: {hi} < {lo}")
        seeds.extend(range(lo, hi + 1))
    return seeds
