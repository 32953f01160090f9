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

from stalwart.sim.strategies.base import Common, Strategy
from stalwart.sim.strategies.baselines import RestartAll, TorchFT
from stalwart.sim.strategies.ours import Stalwart, StalwartParams

__all__ = ["Common", "RestartAll", "Stalwart", "StalwartParams", "Strategy", "TorchFT"]
