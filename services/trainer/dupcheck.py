"""Sampled duplicate computation, trainer side (docs/health.md, "Silent data corruption").

Two roles, both through the coordinator:

- **Gate** (:meth:`DupCheck.confirm`): before pushing a slot batch the
  coordinator samples (``stalwart.sdc.is_sampled``), the trainer reports the
  gradient's CRC32C and waits for the verdict: PUSH, or DROP when other nodes
  computing the same batch outvoted it (it is then quarantined and its slot
  recomputed elsewhere). A gradient never reaches the paramserver before its
  comparison, so a corrupt one is never applied.
- **Verifier** (:meth:`DupCheck.on_checks`): heartbeat answers may list
  GradientChecks (job, step, slot) for this node; it pulls exactly that version,
  recomputes the batch on a private model copy and reports the CRC, never pushing.
  Gradients are bitwise reproducible, so honest nodes agree exactly.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog
import torch

from stalwart import sdc, training
from stalwart.api import coordinator
from stalwart.client.coordinator import CoordinatorClient
from stalwart.errors import RpcError, StalwartError

log = structlog.get_logger(__name__)

VERDICT_POLL_S = 0.05  # between asks while the comparison is pending
VERDICT_TIMEOUT_S = 60.0  # a comparison not decided by then: drop, pull, compute again
PULL_TIMEOUT_S = 30.0


class DupCheck:
    def __init__(self, client: CoordinatorClient, node_id: Callable[[], str], worker):
        self.client = client
        self.node_id = node_id
        self.worker = worker  # services.trainer.worker.Worker: its job, client and task
        self.running: set[tuple[str, int, int]] = set()
        self.done: set[tuple[str, int, int]] = set()
        self._models: dict[str, torch.nn.Module] = {}
        # One recomputation at a time: they share the private model copy.
        self._compute_lock = asyncio.Lock()
        self.verified = 0

    # --- gate --------------------------------------------------------------------------

    async def confirm(self, job_id: str, step: int, slot: int, grads) -> bool:
        """True: push it. False: drop it (outvoted, or undecided for too long)."""
        crc = sdc.gradient_crc32c(grads)
        deadline = time.monotonic() + VERDICT_TIMEOUT_S
        while time.monotonic() < deadline:
            verdict = await self.client.report_gradient(self.node_id(), job_id, step, slot, crc)
            if verdict == coordinator.GRADIENT_VERDICT_PUSH:
                return True
            if verdict == coordinator.GRADIENT_VERDICT_DROP:
                log.warning("gradient outvoted by duplicate compute: dropped",
                            job=job_id, step=step, slot=slot, crc=crc)  # fmt: skip
                return False
            await asyncio.sleep(VERDICT_POLL_S)
        log.warning("no duplicate-compute verdict in time: dropped", job=job_id, step=step)
        return False

    # --- verifier ----------------------------------------------------------------------

    def on_checks(self, checks) -> None:
        for c in checks:
            key = (c.job_id, c.step, c.slot)
            if key not in self.running and key not in self.done:
                self.running.add(key)
                asyncio.ensure_future(self._verify(*key))

    async def _verify(self, job_id: str, step: int, slot: int) -> None:
        key = (job_id, step, slot)
        try:
            job = self.worker.job
            if job is None or job.job_id != job_id or not job.registered:
                return  # not holding that job's weights: the coordinator asks another
            versions, params = await asyncio.wait_for(
                job.client.pull(job_id, -1, step), PULL_TIMEOUT_S
            )
            if min(versions) != step or max(versions) != step:
                log.info("duplicate check skipped: version moved", step=step, got=versions)
                return
            async with self._compute_lock:
                grads = await asyncio.get_running_loop().run_in_executor(
                    None, self._compute, job, params, slot, step
                )
            crc = sdc.gradient_crc32c(grads)
            await self.client.report_gradient(self.node_id(), job_id, step, slot, crc, True)
            self.verified += 1
            self.done.add(key)
        except (RpcError, StalwartError, TimeoutError) as err:
            log.warning("duplicate check failed", job=job_id, step=step, error=str(err))
        finally:
            self.running.discard(key)
            if len(self.done) > 10_000:
                self.done.clear()

    def _compute(self, job, params, slot: int, step: int) -> dict[str, torch.Tensor]:
        model = self._models.get(job.job_id)
        if model is None:
            self._models.clear()  # one job at a time
            model = self._models[job.job_id] = job.task.build_model(job.spec.seed).to(
                self.worker.device
            )
        training.load_params(model, params)
        return training.compute_gradients(job.task, model, slot, step, job.spec)
