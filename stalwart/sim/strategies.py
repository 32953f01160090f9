"""How each strategy answers a failure. Each is a small state machine fed the same
hardware events (:mod:`stalwart.sim.failures`) and charging its costs to a
:class:`~stalwart.sim.engine.Ledger`.

- ``restart-all``: every failure stops the job; it restarts every rank from the last
  durable checkpoint, taken at the Young-Daly interval (TorchElastic / Ray Train).
- ``torchft``: per-replica-group live recovery. A failed group drops out, the others
  re-form the quorum and continue with fewer replicas; the group comes back by copying the
  state from a healthy peer. Job-wide failures take the slow path (restart-all).
- ``stalwart``: a warm standby takes the failed node's slot at the current step; the
  paramservers hold the state (replicated), so nothing rolls back but silent corruption and
  the loss of both replicas of a shard, which go back to the newest in-memory delta
  checkpoint. With ``drain``, nodes the health service predicts to fail are moved off first.
"""

from __future__ import annotations

import math
import random
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


class RestartAll(Strategy):
    name = "restart-all"

    def __init__(self, common: Common, ddp_restart_s: float) -> None:
        self.ddp_restart_s = ddp_restart_s
        super().__init__(common)

    def _detect(self, ev: Event) -> float:
        return self.c.hang_detect_s if ev.cause.manifest == "hang" else self.c.crash_detect_s

    def on_node_failure(self, ev: Event) -> None:
        self.restart_all(self._detect(ev), "restart")

    def on_job_failure(self, ev: Event) -> None:
        self.restart_all(self._detect(ev), "restart")

    def _planned_restart(self) -> None:
        """Save first, then restart without the node: nothing is lost but the time."""
        now = self.q.now
        self.job.advance(now)
        self.job.commit()
        end = self.job.block(now, self.ckpt_cost + self.full_restart_s(), "planned")
        self.schedule_checkpoints(end)

    def on_gray_found(self, ev: Event) -> None:
        self._planned_restart()

    def on_planned(self, ev: Event) -> None:
        self._planned_restart()


class TorchFT(Strategy):
    name = "torchft"

    def __init__(self, common: Common, ddp_restart_s: float, ratio: float,
                 quorum_s: float = 5.0, detect_s: float = 5.0, hang_timeout_s: float = 60.0) -> None:  # fmt: skip
        self.ddp_restart_s = ddp_restart_s
        self.throughput_ratio = ratio
        self.quorum_s, self.detect_s, self.hang_timeout_s = quorum_s, detect_s, hang_timeout_s
        self.down: set[int] = set()
        super().__init__(common)

    def rollback_rate_per_s(self) -> float:
        return failures.rollback_rate_per_s(self.c.model, self.w.gpus, False)

    def capacity(self) -> float:
        return (self.w.replicas - len(self.down)) / self.w.replicas

    def _drop_group(self, node: int, wait_s: float) -> None:
        """Every group waits (``wait_s``, then the quorum; the step in flight is lost); the
        failed group leaves and comes back once replaced, restarted and caught up."""
        group = node // self.w.replica_nodes
        now = self.q.now
        if group in self.down:
            return
        if len(self.down) + 1 >= self.w.replicas:  # no healthy peer to copy from
            self.restart_all(wait_s, "restart")
            return
        self.job.block(now, wait_s + self.quorum_s + self.w.step_s / 2, "quorum")
        self.down.add(group)
        self.refresh_rate()
        back = (self.c.replace_s + self.ddp_restart_s + scaling.group_init_s(self.w)
                + scaling.live_recovery_s(self.w))  # fmt: skip
        self.counts["group_restarts"] += 1
        self.q.at(now + wait_s + back, self._group_back, group)

    def _group_back(self, group: int) -> None:
        if group in self.down:
            self.down.discard(group)
            self.job.block(self.q.now, self.quorum_s, "quorum")
            self.refresh_rate()

    def on_node_failure(self, ev: Event) -> None:
        hang = ev.cause.manifest == "hang"
        self._drop_group(ev.node, self.hang_timeout_s if hang else self.detect_s)

    def on_job_failure(self, ev: Event) -> None:
        self.down.clear()
        self.refresh_rate()
        self.restart_all(self.c.crash_detect_s, "restart")

    def on_gray_found(self, ev: Event) -> None:
        self._drop_group(ev.node, 0.0)

    def on_planned(self, ev: Event) -> None:
        self._drop_group(ev.node, 0.0)


@dataclass(frozen=True)
class StalwartParams:
    standbys: int
    detection_s: float  # measured, one host
    takeover_s: float  # measured kill -> next commit, detection included
    ps_promotion_s: float
    throughput_ratio: float
    ckpt_stall_fraction: float
    ddp_restart_s: float
    drain: bool = False
    precision: float = 0.988
    recall: float = 0.988
    lead_time_h: float = 7.2
    precursor_share: float = 0.3  # of failures of a precursor kind, how many show one
    refill: str = "scheduler"  # scheduler: a fresh standby after replace_s + warm-up; repair: the node itself, repaired
    gray_detect_steps: float = 3.0  # step-time outlier vs peers
    sdc_detect_steps: float = 10.0  # 1-in-10 sampled duplicate compute
    ps_shards: int = 8
    ps_host_share: float = 53 / 419  # Llama 3's host-side causes: what a CPU paramserver host meets


class Stalwart(Strategy):
    name = "stalwart"

    def __init__(self, common: Common, p: StalwartParams) -> None:
        self.p = p
        self.name = "stalwart+drain" if p.drain else "stalwart"
        self.throughput_ratio = p.throughput_ratio
        self.ddp_restart_s = p.ddp_restart_s
        self.pool = p.standbys
        self.missing = 0  # replicas without a node, computed by live ones
        self.out: set[int] = set()  # nodes drained ahead of their failure
        self.slow_waiting: list[int] = []
        self.shard_down_until = [0.0] * p.ps_shards
        self.pool_empty_since: float | None = None if p.standbys else 0.0
        self.pool_empty_s = 0.0
        super().__init__(common)
        self.ckpt_cost = p.ckpt_stall_fraction * self.w.step_s
        self.tau = self._interval()

    def rollback_rate_per_s(self) -> float:
        return failures.rollback_rate_per_s(self.c.model, self.w.gpus, False)

    def capacity(self) -> float:
        live = self.w.replicas - self.missing
        if live <= 0:
            return 0.0
        return 1.0 / math.ceil(self.w.replicas / live)  # a live replica computes the extra slots

    def gray_detect_s(self) -> float:
        return self.p.gray_detect_steps * self.w.step_s

    # --- the pool -------------------------------------------------------------------
    def _take_standby(self) -> bool:
        if self.pool == 0:
            return False
        self.pool -= 1
        if self.pool == 0:
            self.pool_empty_since = self.q.now
        return True

    def _return_node(self, after_s: float) -> None:
        self.q.at(self.q.now + after_s, self._standby_ready)

    def _standby_ready(self) -> None:
        if self.missing:  # a replica is short: the new node takes its slot at once
            self.missing -= 1
            self.job.block(self.q.now, self._takeover_s(), "takeover")
            self.refresh_rate()
            return
        if self.slow_waiting:  # a slow node left in place for want of a standby
            node = self.slow_waiting.pop(0)
            if self.gray.pop(node, None) is not None:
                self.job.block(self.q.now, self._takeover_s(), "takeover")
                self.refresh_rate()
                self.q.at(self.q.now + self._refill_s(None), self._standby_ready)
                return
        if self.pool == 0 and self.pool_empty_since is not None:
            self.pool_empty_s += self.q.now - self.pool_empty_since
            self.pool_empty_since = None
        self.pool += 1

    def _refill_s(self, ev: Event | None) -> float:
        if self.p.refill == "repair" and ev is not None:
            return ev.repair_s
        warm = self.w.params * 2 / self.w.peer_bytes_per_s  # pull the weights
        return self.c.replace_s + self.ddp_restart_s + warm

    def _takeover_s(self) -> float:
        own = max(0.0, self.p.takeover_s - self.p.detection_s)
        return own + (scaling.group_init_s(self.w) if self.w.replica_nodes > 1 else 0.0)

    def _lose_node(self, ev: Event, detect_s: float, lost_step: bool) -> None:
        now = self.q.now
        wait = detect_s + (self.w.step_s / 2 if lost_step else 0.0)
        if self._take_standby():
            self.job.block(now, wait + self._takeover_s(), "takeover")
        else:
            self.job.block(now, wait, "detect")
            self.missing += 1
            self.counts["pool_empty_hits"] += 1
            self.refresh_rate()
        self._return_node(self._refill_s(ev))

    # --- events ---------------------------------------------------------------------
    def start(self) -> None:
        super().start()
        if self.p.drain:
            self._schedule_predictions()
        self._schedule_ps_failures()

    def on_node_failure(self, ev: Event) -> None:
        if ev.node in self.out:
            self.out.discard(ev.node)  # drained ahead of time: the job does not notice
            self.counts["failures_avoided"] += 1
            return
        detect = scaling.detection_s(self.p.detection_s, self.w.nodes)
        if ev.cause.manifest == "hang":  # no refused port: a step-time outlier says so
            detect += 2 * self.w.step_s
        self._lose_node(ev, detect, True)

    def on_job_failure(self, ev: Event) -> None:
        """Every trainer restarts; the paramservers keep the state, so nothing rolls back."""
        self.job.block(self.q.now, scaling.stalwart_job_restart_s(self.w, self.ddp_restart_s),
                       "restart")  # fmt: skip
        self.counts["full_restarts"] += 1

    def on_silent(self, ev: Event) -> None:
        """Duplicate compute catches it within a few steps: back to the in-memory checkpoint
        before it, and the node is quarantined."""
        self.q.at(ev.t + self.p.sdc_detect_steps * self.w.step_s, self._silent_caught, ev,
                  self.job.committed)  # fmt: skip

    def _silent_caught(self, ev: Event, committed: float) -> None:
        self.job.rollback_to(self.q.now, committed)
        self.job.block(self.q.now, self._restore_s(), "restore")
        self.schedule_checkpoints(self.job.blocked_until)
        self._lose_node(ev, 0.0, False)

    def _restore_s(self) -> float:
        return self.w.state_bytes / (self.p.ps_shards * self.w.peer_bytes_per_s)

    def on_gray_found(self, ev: Event) -> None:
        if self._take_standby():
            self.job.block(self.q.now, self._takeover_s(), "takeover")
            self._return_node(self._refill_s(ev))
        elif ev.slowdown >= 2.0:  # computing its slot elsewhere is no slower
            self._lose_node(ev, 0.0, False)
        else:
            self.gray[ev.node] = ev.slowdown  # no standby: it stays, slow, until one comes
            self.slow_waiting.append(ev.node)
            self.refresh_rate()

    def on_planned(self, ev: Event) -> None:
        self._drain(ev)

    def _drain(self, ev: Event) -> bool:
        """Move the node's work to a standby at a step boundary: no step is lost."""
        if not self._take_standby():
            return False
        self.job.block(self.q.now, self._takeover_s(), "takeover")
        self._return_node(self._refill_s(ev))
        return True

    # --- prediction -------------------------------------------------------------------
    def _schedule_predictions(self) -> None:
        """Failures with a precursor are caught with probability precursor_share x recall,
        ``lead_time`` ahead (exponential); false alarms follow from the precision."""
        hit = self.p.precursor_share * self.p.recall
        self._predicted: list[Event] = []
        for ev in self._events:
            if ev.kind == "fail" and ev.cause.precursor and ev.cause.manifest != "silent" \
                    and ev.draw < hit:  # fmt: skip
                self._predicted.append(ev)
                lead = ev.lead_draw * self.p.lead_time_h * failures.HOUR
                self.q.at(max(0.0, ev.t - lead), self._predicted_fail, ev)
        if not self._predicted:
            return
        alarms = len(self._predicted) * (1 - self.p.precision) / self.p.precision
        rng = random.Random(f"false-alarm:{self.c.seed}:{self.w.gpus}")
        for _ in range(int(alarms) + (rng.random() < alarms % 1)):
            self.q.at(rng.uniform(0, self._horizon), self._false_alarm)

    def _predicted_fail(self, ev: Event) -> None:
        if ev.node not in self.out and self._drain(ev):
            self.out.add(ev.node)
            self.counts["drained_ahead"] += 1

    def _false_alarm(self) -> None:
        self.counts["false_alarms"] += 1
        fake = Event(self.q.now, "planned", -1, repair_s=3600.0)  # found healthy after an hour
        self._drain(fake)

    # --- paramservers -----------------------------------------------------------------
    def _schedule_ps_failures(self) -> None:
        hosts = 2 * self.p.ps_shards  # primary + one backup per shard
        rate = hosts * self.w.gpus_per_node * self.c.model.rate_per_gpu_hour * self.p.ps_host_share
        rng = random.Random(f"ps:{self.c.seed}:{self.w.gpus}")
        for t in failures._poisson_times(rng, rate / failures.HOUR, self._horizon):
            self.q.at(t, self._ps_fail, rng.randrange(self.p.ps_shards))

    def _ps_fail(self, shard: int) -> None:
        """A backup is promoted; a spare replica copies the shard. If the shard's other
        replica is still being rebuilt, both are gone: back to the in-memory checkpoint."""
        now = self.q.now
        self.counts["ps_failures"] += 1
        rebuild = self.w.state_bytes / self.p.ps_shards / self.w.peer_bytes_per_s
        if self.shard_down_until[shard] > now:
            self.counts["ps_shard_lost"] += 1
            self.job.rollback(now)
            self.job.block(now, self._restore_s(), "restore")
            self.schedule_checkpoints(self.job.blocked_until)
        else:
            self.job.block(now, self.p.ps_promotion_s + self.w.step_s / 2, "ps_promotion")
        self.shard_down_until[shard] = now + rebuild

    def run(self, events: list[Event], horizon_s: float) -> dict:
        self._events, self._horizon = events, horizon_s
        out = super().run(events, horizon_s)
        if self.pool_empty_since is not None:
            self.pool_empty_s += horizon_s - self.pool_empty_since
        out["standbys"] = self.p.standbys
        out["pool_empty_share"] = self.pool_empty_s / horizon_s
        return out
