"""Silent-data-corruption defences the coordinator carries out (decisions in gradchecks.py).

- ReportGradient: sampled duplicate computation. The slot holder reports its
  gradient's CRC32C before pushing and polls for a verdict; other trainers of the
  job (standbys first) are asked, through their heartbeat answers, to recompute
  the batch. The majority decides; the outvoted node is quarantined.
- ReportCorruption: a node reports what it caught itself (ABFT): quarantine.
- Replica fingerprints at each checkpoint (checkpoints.py, replicacheck.py): an
  outvoted paramserver replica is quarantined, which takes it out of its shard
  group; a disagreement with no majority blames nobody and is only counted,
  announced and alerted here.

Every detection is counted (``stalwart_sdc_detections_total{source}``), sent to the
health service as a DATA_CORRUPTION alert when one is configured, and announced
as EVENT_KIND_NODE_QUARANTINED; placement then moves the node's slot to a
standby, which recomputes the batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

import structlog

from services.coordinator import placement
from services.coordinator.control import EV
from services.coordinator.gradchecks import GradientChecks, Verdict
from services.coordinator.membership import NodeState
from stalwart import sdc
from stalwart.api import coordinator
from stalwart.errors import ErrorKind, StalwartError

log = structlog.get_logger(__name__)

VERDICTS = {
    Verdict.WAIT: coordinator.GRADIENT_VERDICT_WAIT,
    Verdict.PUSH: coordinator.GRADIENT_VERDICT_PUSH,
    Verdict.DROP: coordinator.GRADIENT_VERDICT_DROP,
}
KINDS = set(sdc.SOURCES)
# The enum's values by the short names the metrics and logs use.
CORRUPTION_KINDS = {
    coordinator.CORRUPTION_KIND_CRC: "crc",
    coordinator.CORRUPTION_KIND_ABFT: "abft",
    coordinator.CORRUPTION_KIND_FINGERPRINT: "fingerprint",
    coordinator.CORRUPTION_KIND_DUPLICATE_COMPUTE: "duplicate_compute",
    coordinator.CORRUPTION_KIND_NONFINITE: "nonfinite",
}


def _kind_of(r: coordinator.ReportCorruptionRequest) -> str:
    """The short name of what caught it: the enum, else the deprecated string field."""
    if r.corruption_kind != coordinator.CORRUPTION_KIND_UNSPECIFIED:
        if r.corruption_kind not in CORRUPTION_KINDS:
            raise StalwartError(ErrorKind.INVALID_ARGUMENT,
                                f"corruption_kind {r.corruption_kind} is not a CorruptionKind")  # fmt: skip
        return CORRUPTION_KINDS[r.corruption_kind]
    if r.kind not in KINDS:
        raise StalwartError(ErrorKind.INVALID_ARGUMENT, f"kind must be one of {sorted(KINDS)}")
    return r.kind


Alert = Callable[[str, str], Awaitable[None]]  # (node id, message)


class SdcGuard:
    def __init__(self, control, verifier_timeout_s: float, alert: Alert | None = None):
        self.control = control
        self.checks = GradientChecks(verifier_timeout_s)
        self.alert = alert
        self.unverified = 0

    # --- duplicate compute ------------------------------------------------------------

    async def report_gradient(self, r: coordinator.ReportGradientRequest) -> int:
        c = self.control
        job = c.job(r.job_id)  # NOT_LEADER / UNKNOWN_JOB
        if r.node_id not in c.members.nodes:
            raise StalwartError(ErrorKind.UNKNOWN_NODE, f"node {r.node_id!r} is not registered")
        key = (r.job_id, r.step, r.slot)
        if r.duplicate:
            await self._quarantine(self.checks.duplicate_report(key, r.node_id, r.gradient_crc32c),
                                   key)  # fmt: skip
            return coordinator.GRADIENT_VERDICT_WAIT
        if c.members.nodes[r.node_id].state is NodeState.QUARANTINED:
            return coordinator.GRADIENT_VERDICT_DROP  # nothing from it is applied any more
        out = self.checks.holder_report(
            key, r.node_id, r.gradient_crc32c, self._candidates(job, r.node_id), time.monotonic()
        )
        if out.unverified:
            self.unverified += 1
        if out.restarted:
            log.warning("duplicate compute disagrees with no majority possible; recomputing",
                        job=r.job_id, step=r.step, slot=r.slot)  # fmt: skip
        await self._quarantine(out.quarantine, key)
        return VERDICTS[out.verdict]

    def checks_for(self, node_id: str) -> list[coordinator.GradientCheck]:
        return [
            coordinator.GradientCheck(job_id=j, step=s, slot=k)
            for j, s, k in self.checks.asked_of(node_id)
        ]

    def _candidates(self, job, reporter: str) -> list[str]:
        """Trainers holding the job's weights, warm standbys first, best ranked first."""
        nodes = self.control.members.nodes

        def usable(n: str) -> bool:
            node = nodes.get(n)
            return node is not None and node.state is NodeState.ALIVE and n != reporter

        standbys = sorted((nodes[n] for n in job.standbys if usable(n)), key=placement.rank_key)
        holders = sorted(
            # a set: one trainer may hold several slots (elastic.py)
            (nodes[n] for n in {s.node_id for s in job.slots if s.node_id} if usable(n)),
            key=placement.rank_key,
        )
        return [n.node_id for n in standbys + holders]

    # --- reports from nodes -------------------------------------------------------------

    async def report_corruption(self, r: coordinator.ReportCorruptionRequest) -> int:
        self.control.require_leader()
        kind = _kind_of(r)
        suspect = r.suspect_node_id or r.node_id
        if suspect not in self.control.members.nodes:
            raise StalwartError(ErrorKind.NOT_FOUND, f"no node {suspect!r}")
        why = f"{kind} reported by {r.node_id} at step {r.step}: {r.message}"
        await self.quarantine(suspect, kind, why)
        return coordinator.NODE_STATE_QUARANTINED

    async def _quarantine(self, nodes, key) -> None:
        for node in nodes:
            job_id, step, slot = key
            why = f"gradient of {job_id} step {step} slot {slot} outvoted by duplicate compute"
            await self.quarantine(node, "duplicate_compute", why)

    async def quarantine(self, node_id: str, kind: str, why: str) -> None:
        """Count, quarantine (the slot moves to a standby) and alert."""
        sdc.DETECTIONS.labels(kind).inc()
        log.error("corruption detected: quarantining", node=node_id, kind=kind, why=why)
        await self.control.quarantine(node_id, why)
        if self.alert is not None:
            asyncio.ensure_future(self._alert_quietly(node_id, why))

    async def unattributed(
        self, kind: str, why: str, job_id: str, step: int, suspects: list[str]
    ) -> None:
        """Corruption seen with nobody to blame: count, announce, alert about each suspect."""
        sdc.DETECTIONS.labels(kind).inc()
        log.error("corruption detected", kind=kind, why=why)
        c = self.control
        async with c.lock:
            c.events.add(EV.EVENT_KIND_CORRUPTION_DETECTED, why, job_id=job_id, step=step)
            await c._flush()
        if self.alert is not None:
            for node_id in suspects:
                asyncio.ensure_future(self._alert_quietly(node_id, why))

    async def _alert_quietly(self, node_id: str, why: str) -> None:
        with contextlib.suppress(Exception):  # advisory: the quarantine already happened
            await self.alert(node_id, why)
