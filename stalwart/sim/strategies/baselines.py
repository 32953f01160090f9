"""What users run instead: restart everything from a checkpoint (TorchElastic / Ray Train),
and torchft-style per-replica-group live recovery."""

from __future__ import annotations

from stalwart.sim import failures, scaling
from stalwart.sim.failures import Event
from stalwart.sim.strategies.base import Common, Strategy


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
