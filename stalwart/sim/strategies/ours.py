"""Stalwart: warm standbys take a failed node's slot at the current step, replicated
paramservers hold the state, in-memory delta checkpoints, optional predictive drain."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from stalwart.sim import failures, scaling
from stalwart.sim.failures import Event
from stalwart.sim.strategies.base import Common, Strategy


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
