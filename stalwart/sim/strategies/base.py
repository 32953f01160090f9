"""What every strategy shares: the job's ledger, periodic checkpoints at the Young-Daly
interval, gray failures, and the slow path (restart every rank from a checkpoint)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from stalwart.sim import failures, scaling
from stalwart.sim.engine import EventQueue, Ledger
from stalwart.sim.failures import Event


@dataclass(frozen=True)
class Common:
    """What every strategy shares about the job and the cluster around it."""

    workload: scaling.Workload
    model: failures.FailureModel
    seed: int
    replace_s: float = 120.0  # the scheduler swaps a failed node for a spare
    sdc_detect_s: float = (
        2 * 3600.0
    )  # silent corruption noticed (loss spike, NaN) without our checks
    gray_detect_s: float = 1800.0  # a slow node found by dashboards / straggler tools
    crash_detect_s: float = 30.0  # a dead rank noticed by the launcher
    hang_detect_s: float = 600.0  # collective timeout (PyTorch's default NCCL timeout)
    ckpt_s: float | None = None  # checkpoint stall; None: scaling.checkpoint_s
    load_s: float | None = None  # reading it back on restart; None: scaling.checkpoint_s
    ckpt_interval_s: float | None = None  # None: Young-Daly
    ckpt_interval_scale: float = 1.0  # multiplies the chosen interval (sensitivity)


class Strategy:
    name = "base"
    throughput_ratio = 1.0

    def __init__(self, common: Common) -> None:
        self.c = common
        self.w = common.workload
        self.q = EventQueue()
        self.job = Ledger()
        self.gray: dict[int, float] = {}  # node -> slowdown, while undetected and slow
        self.counts: Counter = Counter()
        self.gen = 0  # checkpoint generation: a rollback makes scheduled checkpoints stale
        self.horizon_s = float("inf")
        self.ckpt_cost = (
            common.ckpt_s if common.ckpt_s is not None else scaling.checkpoint_s(self.w)
        )
        self.tau = self._interval()

    # --- checkpoints --------------------------------------------------------------
    def rollback_rate_per_s(self) -> float:
        return failures.rollback_rate_per_s(self.c.model, self.w.gpus, True)

    def _interval(self) -> float:
        if self.c.ckpt_interval_s is not None:
            return self.c.ckpt_interval_s * self.c.ckpt_interval_scale
        rate = self.rollback_rate_per_s()
        mtbf = 1.0 / rate if rate > 0 else 1e12
        return math.sqrt(2 * self.ckpt_cost * mtbf) * self.c.ckpt_interval_scale  # Young-Daly

    def schedule_checkpoints(self, resume_at: float) -> None:
        self.gen += 1
        self.q.at(resume_at + self.tau, self._ckpt_begin, self.gen)

    def _ckpt_begin(self, gen: int) -> None:
        if gen != self.gen:
            return
        now = self.q.now
        if not self.job.running(now):  # blocked by something else: checkpoint once it runs
            self.q.at(self.job.blocked_until, self._ckpt_begin, gen)
            return
        cycle = self.ckpt_cost + self.tau
        until = min(self.q.next_time(), self.horizon_s)
        quiet = int((until - now) // cycle)  # whole cycles before anything else happens
        if quiet >= 2:  # step over them at once: checkpoints would be most of the events
            end = self.job.checkpoint_cycles(now, quiet, self.ckpt_cost, self.tau)
            self.counts["checkpoints"] += quiet
            self.q.at(end, self._ckpt_begin, gen)
            return
        self.job.advance(now)
        end = self.job.block(now, self.ckpt_cost, "checkpoint")
        self.q.at(end, self._ckpt_end, gen, self.job.pending)

    def _ckpt_end(self, gen: int, amount: float) -> None:
        if gen != self.gen:
            return
        self.job.commit(amount)
        self.counts["checkpoints"] += 1
        self.q.at(self.q.now + self.tau, self._ckpt_begin, gen)

    # --- rate ---------------------------------------------------------------------
    def capacity(self) -> float:
        return 1.0

    def refresh_rate(self) -> None:
        slow = max(self.gray.values(), default=1.0)  # synchronous steps wait for the slowest
        self.job.set_rate(self.q.now, self.capacity() / slow)

    # --- the run ------------------------------------------------------------------
    def run(self, events: list[Event], horizon_s: float) -> dict:
        self.horizon_s = horizon_s
        for ev in events:
            self.q.at(ev.t, self._dispatch, ev)
        self.start()
        self.q.run(horizon_s)
        self.job.advance(horizon_s)
        return self.result(horizon_s)

    def start(self) -> None:
        self.schedule_checkpoints(0.0)

    def _dispatch(self, ev: Event) -> None:
        self.counts[ev.kind] += 1
        if ev.kind == "fail":
            if self.gray.pop(ev.node, None) is not None:  # a slow node that now fails outright
                self.refresh_rate()
            if ev.cause.manifest == "silent":
                self.on_silent(ev)
            elif ev.cause.scope == "job":
                self.on_job_failure(ev)
            else:
                self.on_node_failure(ev)
        elif ev.kind == "gray":
            self.gray[ev.node] = max(self.gray.get(ev.node, 1.0), ev.slowdown)
            self.refresh_rate()
            self.q.at(ev.t + ev.duration_s, self._gray_over, ev.node)
            self.q.at(ev.t + self.gray_detect_s(), self._gray_found, ev)
        elif ev.kind == "planned":
            self.on_planned(ev)

    def _gray_over(self, node: int) -> None:
        if self.gray.pop(node, None) is not None:
            self.refresh_rate()

    def _gray_found(self, ev: Event) -> None:
        if self.gray.pop(ev.node, None) is not None:
            self.counts["gray_drained"] += 1
            self.refresh_rate()
            self.on_gray_found(ev)

    def result(self, horizon_s: float) -> dict:
        j = self.job
        ettr = j.productive / horizon_s
        waste = {f"blocked_{k}": v / horizon_s for k, v in sorted(j.blocked.items()) if v > 0}
        waste |= {"rolled_back": j.lost / horizon_s, "degraded": j.degraded / horizon_s}
        return {"ettr": ettr, "throughput_ratio": self.throughput_ratio,
                "effective_throughput": ettr * self.throughput_ratio,
                "checkpoint_interval_s": self.tau, "checkpoint_s": self.ckpt_cost,
                "waste": waste, "counts": dict(self.counts)}  # fmt: skip

    # --- what each strategy overrides ------------------------------------------------
    def gray_detect_s(self) -> float:
        return self.c.gray_detect_s

    def on_node_failure(self, ev: Event) -> None:
        raise NotImplementedError

    def on_job_failure(self, ev: Event) -> None:
        raise NotImplementedError

    def on_silent(self, ev: Event) -> None:
        """Found late by its symptoms; back to the checkpoint before the corruption."""
        self.q.at(ev.t + self.c.sdc_detect_s, self._silent_found, self.job.committed)

    def _silent_found(self, committed: float) -> None:
        self.job.rollback_to(self.q.now, committed)
        self.restart_all(0.0, "restart")

    def on_gray_found(self, ev: Event) -> None:
        raise NotImplementedError

    def on_planned(self, ev: Event) -> None:
        raise NotImplementedError

    # --- the slow path every strategy has ------------------------------------------------
    def full_restart_s(self) -> float:
        load = self.c.load_s if self.c.load_s is not None else scaling.checkpoint_s(self.w)
        return self.c.replace_s + self.ddp_restart_s + scaling.rendezvous_s(self.w.nodes) + load

    ddp_restart_s = 30.0

    def restart_all(self, detect_s: float, reason: str) -> None:
        now = self.q.now
        self.job.rollback(now)
        end = self.job.block(now, detect_s + self.full_restart_s(), reason)
        self.counts["full_restarts"] += 1
        self.schedule_checkpoints(end)
