"""The event engine against closed forms: restart-all with exponential failures."""

import math

import pytest

from stalwart.sim import failures, published, scaling
from stalwart.sim.engine import EventQueue, Ledger
from stalwart.sim.strategies import Common, RestartAll


def test_queue_orders_by_time_then_insertion():
    q, seen = EventQueue(), []
    for t, tag in ((2.0, "b"), (1.0, "a"), (2.0, "c")):
        q.at(t, seen.append, tag)
    q.run(10.0)
    assert seen == ["a", "b", "c"] and q.now == 10.0


def test_ledger_accrues_blocks_and_rolls_back():
    j = Ledger()
    j.advance(10.0)  # 10 s productive, pending
    j.commit()
    j.block(10.0, 5.0, "restart")  # 10..15 blocked
    j.set_rate(20.0, 0.5)  # 15..20 at full rate
    j.advance(30.0)  # 20..30 at half rate
    assert j.blocked["restart"] == pytest.approx(5.0)
    assert j.pending == pytest.approx(5.0 + 5.0)
    assert j.degraded == pytest.approx(5.0)
    j.rollback(30.0)
    assert (j.committed, j.pending, j.lost) == (pytest.approx(10.0), 0.0, pytest.approx(10.0))
    j.rollback_to(30.0, 4.0)
    assert j.committed == 4.0 and j.lost == pytest.approx(16.0)


def _exponential_model(mtbf_s: float, gpus: int) -> failures.FailureModel:
    cause = published.Cause("crash", 1, "crash", "node", False)
    return failures.FailureModel("test", 3600.0 / mtbf_s / gpus, (cause,), gray_per_failure=0.0)


@pytest.mark.parametrize(("mtbf_s", "ckpt_s"), [(3 * 3600.0, 60.0), (1800.0, 10.0)])
def test_restart_all_matches_the_exact_expectation(mtbf_s, ckpt_s):
    """Failures anywhere (also in checkpoints and restarts), a restart of R after each:
    expected wall time per interval of work tau is e^(lR) (e^(l(tau+C)) - 1) / l."""
    gpus = 1024
    model = _exponential_model(mtbf_s, gpus)
    common = Common(
        workload=scaling.Workload(gpus=gpus),
        model=model,
        seed=1,
        replace_s=0.0,
        crash_detect_s=0.0,
        ckpt_s=ckpt_s,
        load_s=0.0,
    )
    strategy = RestartAll(common, ddp_restart_s=20.0)
    assert strategy.tau == pytest.approx(math.sqrt(2 * ckpt_s * mtbf_s))  # Young-Daly
    horizon = 3000 * mtbf_s
    events = failures.sample(model, gpus, 8, horizon, seed=1)
    got = strategy.run(events, horizon)["ettr"]
    lam, tau, r = 1 / mtbf_s, strategy.tau, strategy.full_restart_s()
    want = tau * lam / (math.exp(lam * r) * (math.exp(lam * (tau + ckpt_s)) - 1))
    assert got == pytest.approx(want, abs=0.006)
    # and the first-order Young-Daly waste sqrt(2C/M) + R/M is close to it
    assert 1 - math.sqrt(2 * ckpt_s / mtbf_s) - r / mtbf_s == pytest.approx(want, abs=0.02)


def test_no_failures_costs_only_checkpoints():
    gpus = 1024
    model = _exponential_model(1e15, gpus)
    common = Common(
        workload=scaling.Workload(gpus=gpus),
        model=model,
        seed=0,
        ckpt_s=10.0,
        ckpt_interval_s=990.0,
    )
    got = RestartAll(common, 20.0).run([], 1e6)["ettr"]
    assert got == pytest.approx(990 / 1000, abs=1e-3)


def test_checkpoint_cycles_at_once_equal_one_by_one():
    one, many = Ledger(), Ledger()
    for j in (one, many):
        j.advance(3.0)
        j.set_rate(3.0, 0.5)
    t = 3.0
    for _ in range(4):  # stall 2 s (commits what was pending), then run 10 s
        amount = one.pending
        one.block(t, 2.0, "checkpoint")
        one.advance(t + 2.0)
        one.commit(amount)
        one.advance(t + 12.0)
        t += 12.0
    end = many.checkpoint_cycles(3.0, 4, 2.0, 10.0)
    assert end == t
    for attr in ("committed", "pending", "degraded", "t"):
        assert getattr(many, attr) == pytest.approx(getattr(one, attr)), attr
    assert many.blocked["checkpoint"] == pytest.approx(one.blocked["checkpoint"])
