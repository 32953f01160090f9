"""The health service's decisions on plain values: rules, risk thresholds, the fleet
forest and alert drafts (no gRPC)."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest

from services.health import detectors, rules
from services.health.fleet import (
    ANOMALY,
    DATA_CORRUPTION,
    PREDICTED_FAILURE,
    STRAGGLER,
    Fleet,
    FleetFull,
    HealthConfig,
)
from services.health.online import FleetForest, gauge_names
from services.health.servicer import check_sample, risk_proto
from services.health.window import NodeWindow, Sample
from stalwart.api import coordinator, health
from stalwart.errors import ErrorKind, StalwartError

pytestmark = pytest.mark.timeout(60)
CFG = rules.RuleConfig()


def window(*rows: tuple[float, int, dict]) -> NodeWindow:
    w = NodeWindow("n")
    for t, step, metrics in rows:
        w.add(Sample(t, step, metrics))
    return w


@pytest.mark.parametrize(
    "temps, want",
    [
        ([60, 60, 61], 0.0),  # cool: no finding at all
        ([83, 83, 83], 0.5),  # at the warning line
        ([87.5, 87.5, 87.5], 0.75),  # half way to critical
        ([95, 95, 95], 1.0),  # past critical: capped at 1
    ],
)
def test_thermal_risk_is_linear_between_warning_and_critical(temps, want):
    w = window(*[(float(i), i, {"gpu_temperature_celsius": t}) for i, t in enumerate(temps)])
    found = rules.thermal(w, CFG)
    assert (found[0].risk if found else 0.0) == pytest.approx(want)


def test_a_warm_gpu_climbing_fast_is_at_risk_before_it_is_critical():
    # 84 C climbing 1 C/s: critical (92) within the 30 s lead time
    w = window(*[(float(i), i, {"gpu_temperature_celsius": 80.0 + i}) for i in range(5)])
    assert rules.thermal(w, CFG)[0].risk == pytest.approx(0.85)


def test_ecc_and_fatal_xid_counters_that_grow_mean_risk_one():
    assert rules.hardware(window((0, 0, {"gpu_ecc_errors_total": 3}),
                                 (1, 1, {"gpu_ecc_errors_total": 3}))) == []  # fmt: skip
    grew = rules.hardware(window((0, 0, {"gpu_ecc_errors_total": 3}),
                                 (1, 1, {"gpu_ecc_errors_total": 5})))  # fmt: skip
    assert [(f.risk, f.message) for f in grew] == [(1.0, "2 uncorrectable ECC errors")]
    xid = rules.hardware(window((0, 0, {"gpu_xid_errors_total": 0}),
                                (1, 1, {"gpu_xid_errors_total": 1, "gpu_xid_last": 79})))  # fmt: skip
    assert xid[0].risk == 1.0
    benign = rules.hardware(window((0, 0, {"gpu_xid_errors_total": 0}),
                                   (1, 1, {"gpu_xid_errors_total": 1, "gpu_xid_last": 13})))  # fmt: skip
    assert benign[0].risk == 0.6


@pytest.mark.parametrize("ratio, want", [(1.0, None), (2.0, 0.4), (3.0, 0.8), (5.0, 1.0)])
def test_straggler_risk_grows_with_the_ratio_to_peers(ratio, want):
    me = window(*[(i, i, {"step_time_seconds": 0.1 * ratio}) for i in range(5)])
    peers = [window(*[(i, i, {"step_time_seconds": 0.1}) for i in range(5)]) for _ in range(2)]
    found = rules.straggler(me, peers, CFG)
    assert (found[0].risk if found else None) == (pytest.approx(want) if want else None)


def test_straggler_needs_enough_steps_on_both_sides():
    me = window(*[(i, i, {"step_time_seconds": 1.0}) for i in range(4)])
    peer = window(*[(i, i, {"step_time_seconds": 0.1}) for i in range(5)])
    assert rules.straggler(me, [peer], CFG) == []  # 4 steps: not judged yet
    me.add(Sample(4, 4, {"step_time_seconds": 1.0}))
    assert rules.straggler(me, [peer], CFG)[0].risk == 1.0


def test_a_peer_is_compared_over_the_same_steps_not_its_own_latest() -> None:
    # steps 16-20 were slow for every slot of a synchronous job (they all waited for a
    # throttled one); a standby promoted at step 21 has only fast steps behind it
    slow_then_fast = [(t, t, {"step_time_seconds": 0.1 if t <= 20 else 0.01})
                      for t in range(12, 24)]  # fmt: skip
    me = window(*[r for r in slow_then_fast if r[1] in (16, 17, 18, 19, 20)])
    promoted = window(*[(t, t, {"step_time_seconds": 0.01}) for t in range(21, 30)])
    assert rules.straggler(me, [promoted], CFG) == []  # nothing of it in steps 16-20
    waited_too = window(*slow_then_fast)
    assert rules.straggler(me, [promoted, waited_too], CFG) == []  # same steps, same times
    # a node slow over the very steps its peers ran fast is still found
    fast_peer = window(*[(t, t, {"step_time_seconds": 0.02}) for t in range(12, 24)])
    assert rules.straggler(me, [promoted, fast_peer], CFG)[0].risk == 1.0


def test_a_node_whose_samples_caught_steps_slow_for_everyone_is_no_straggler() -> None:
    # sampled from a demo run: trainer-1's five samples include the job's first step and
    # two of the steps every slot waited through for a throttled peer
    me = window(
        *[
            (s, s, {"step_time_seconds": v})
            for s, v in [(0, 0.1031), (6, 0.0235), (14, 0.039), (16, 0.1204), (17, 0.116)]
        ]
    )
    peer = window(
        *[
            (s, s, {"step_time_seconds": v})
            for s, v in [(2, 0.048), (10, 0.0259), (15, 0.0296), (17, 0.1143)]
        ]
    )
    assert rules.straggler(me, [peer], CFG) == []
    # slow on every one of its steps: found
    slow = window(*[(s, s, {"step_time_seconds": 0.2}) for s in (0, 6, 14, 16, 17)])
    assert rules.straggler(slow, [peer], CFG)[0].risk == 1.0


def test_counter_increase_survives_a_reset():
    w = window((0, 0, {"c_total": 5}), (1, 1, {"c_total": 7}), (2, 2, {"c_total": 1}))
    assert w.increase("c_total") == 3  # +2, then a restart counted from 0: +1


def test_fleet_raises_one_drain_alert_when_risk_crosses_the_threshold():
    fleet = Fleet(HealthConfig(drain_threshold=0.8, alert_repeat_seconds=1000))
    drafts = []
    for i, temp in enumerate([70, 75, 80, 84, 88, 91, 93, 95]):
        # 100 s apart: too slow a climb for the trend rule, only the level counts
        a, d = fleet.observe("n1", float(i * 100), i, {"gpu_temperature_celsius": temp})
        drafts += [(i, x) for x in d]
    # 84 C is risk 0.56, 88 C is 0.78, 91 C is 0.94: the first drain alert at 91 C,
    # and no repeat within alert_repeat_seconds.
    assert [(i, x.kind, x.drain) for i, x in drafts] == [(5, PREDICTED_FAILURE, True)]
    assert drafts[0][1].risk == pytest.approx(0.5 + 0.5 * 8 / 9)
    assert fleet.assessments["n1"].risk == 1.0
    assert fleet.assessments["n1"].top_signals[0] == "gpu_temperature_celsius"


def test_fleet_flags_a_straggler_against_its_live_peers_only():
    fleet = Fleet(HealthConfig(peer_stale_seconds=5))
    for step in range(6):
        fleet.observe("slow", step, step, {"step_time_seconds": 0.5})
        fleet.observe("fast", step, step, {"step_time_seconds": 0.1})
    a = fleet.assessments["slow"]
    assert a.risk == 1.0 and a.top_signals[0] == "step_time_seconds"
    assert fleet._last_alert[("slow", STRAGGLER)] >= 0
    # 100 s later the peer is stale: nothing to compare with, the risk falls
    a, drafts = fleet.observe("slow", 100.0, 7, {"step_time_seconds": 0.5})
    assert a.risk == 0.0 and drafts == []


def test_reported_corruption_pins_the_risk_at_one():
    fleet = Fleet()
    fleet.observe("n1", 0.0, 0, {"loss": 1.0})
    draft = fleet.report_corruption("n1", "gradient fingerprint outvoted", 1.0)
    assert (draft.kind, draft.risk) == (DATA_CORRUPTION, 1.0)
    a, drafts = fleet.observe("n1", 2.0, 1, {"loss": 1.0})
    assert a.risk == 1.0 and a.reasons[0] == "gradient fingerprint outvoted" and drafts == []


def test_fleet_forest_scores_an_outlier_high_and_normal_samples_low():
    rng = np.random.default_rng(0)
    forest = FleetForest(fit_samples=200, seed=0)
    for _ in range(200):
        forest.collect({"gpu_power_watts": 300 + rng.normal(0, 5),
                        "step_time_seconds": 0.1 + rng.normal(0, 0.002),
                        "steps_total": 5.0})  # fmt: skip
    forest.fit()
    assert forest.features == ["gpu_power_watts", "step_time_seconds"]  # counters left out
    normal, _ = forest.score({"gpu_power_watts": 300.0, "step_time_seconds": 0.1})
    odd, top = forest.score({"gpu_power_watts": 180.0, "step_time_seconds": 0.1})
    assert normal < 0.5 and odd == 1.0
    assert top == ["gpu_power_watts"]


def test_anomaly_alone_alerts_but_does_not_ask_for_a_drain():
    fleet = Fleet(HealthConfig(fit_samples=50))
    for i in range(50):
        fleet.observe(f"n{i % 5}", float(i), i, {"gpu_power_watts": 300.0 + (i % 7)})
    fleet.forest.fit()
    # the risk shows at once; the alert waits for the third strange scoring in a row
    # (one every anomaly_every_seconds, 2 s), and its peers keep reporting meanwhile
    kinds = []
    for k, t in enumerate((60.0, 62.5, 65.0)):
        for peer in ("n0", "n2", "n3", "n4"):
            fleet.observe(peer, t, 60 + k, {"gpu_power_watts": 300.0 + k})
        a, drafts = fleet.observe("n1", t, 60 + k, {"gpu_power_watts": 100.0})
        assert a.anomaly == 1.0 and a.risk == pytest.approx(0.6)
        kinds.append([(d.kind, d.drain) for d in drafts])
    assert kinds == [[], [], [(ANOMALY, False)]]


def test_one_strange_scoring_between_normal_ones_raises_no_alert():
    fleet = Fleet(HealthConfig(fit_samples=50))
    for i in range(50):
        fleet.observe(f"n{i % 5}", float(i), i, {"gpu_power_watts": 300.0 + (i % 7)})
    fleet.forest.fit()
    readings = [100.0, 300.0, 100.0, 100.0, 302.0, 100.0]  # never three strange in a row
    for k, watts in enumerate(readings):
        t = 60.0 + 2.5 * k
        for peer in ("n0", "n2", "n3", "n4"):
            fleet.observe(peer, t, 60 + k, {"gpu_power_watts": 300.0 + k % 3})
        _, drafts = fleet.observe("n1", t, 60 + k, {"gpu_power_watts": watts})
        assert drafts == []


def test_gauge_names_need_most_samples():
    assert gauge_names([{"a": 1, "b": 1}, {"a": 1}, {"a": 2, "x_total": 4}]) == ["a"]


@pytest.mark.parametrize(
    "node_id, metrics, kind",
    [
        ("", {"a": 1.0}, ErrorKind.INVALID_ARGUMENT),
        ("n", {"a": math.nan}, ErrorKind.INVALID_ARGUMENT),
        ("n", {"a": math.inf}, ErrorKind.INVALID_ARGUMENT),
        ("n", {f"m{i}": 1.0 for i in range(9)}, ErrorKind.LIMIT_EXCEEDED),
    ],
)
def test_bad_samples_are_refused(node_id, metrics, kind):
    sample = coordinator.TelemetrySample(node_id=node_id, metrics=metrics)
    with pytest.raises(StalwartError) as info:
        check_sample(sample, max_metrics=8)
    assert info.value.kind is kind
    check_sample(coordinator.TelemetrySample(node_id="n", metrics={"a": 1.0}), 8)


@pytest.mark.parametrize(
    "temps, want",
    [
        ([80, 81, 82, 83, 84], 8.0),  # 1 C/s from 84 C: 92 C in 8 s
        ([85, 85, 85], None),  # warm but steady: no time predicted
        ([93, 93, 93], 0.0),  # past critical: now
    ],
)
def test_thermal_finding_predicts_the_time_to_critical(temps, want):
    w = window(*[(float(i), i, {"gpu_temperature_celsius": t}) for i, t in enumerate(temps)])
    lead = rules.thermal(w, CFG)[0].lead_s
    assert lead == (pytest.approx(want) if want is not None else None)


def test_assessment_carries_the_soonest_lead_and_the_proto_sets_it_only_then():
    fleet = Fleet()
    for i in range(5):
        a, _ = fleet.observe("hot", float(i), i, {"gpu_temperature_celsius": 80.0 + 2 * i})
    assert a.lead_s == pytest.approx(2.0)  # 88 C rising 2 C/s
    proto = risk_proto(a)
    assert proto.HasField("predicted_lead_time")
    assert proto.predicted_lead_time.ToNanoseconds() == pytest.approx(2e9)
    cool, _ = fleet.observe("cool", 0.0, 0, {"gpu_temperature_celsius": 60.0})
    assert cool.lead_s is None and not risk_proto(cool).HasField("predicted_lead_time")


def test_the_risk_carries_the_findings_a_drain_names():
    """NodeRisk.reasons: the coordinator's poll drains with the words an alert uses."""
    fleet = Fleet()
    for i in range(5):
        a, _ = fleet.observe("hot", float(i), i, {"gpu_temperature_celsius": 80.0 + 2 * i})
    assert list(risk_proto(a).reasons) == ["GPU at 88.0 C, rising 2.00 C/s"]
    cool, _ = fleet.observe("cool", 0.0, 0, {"gpu_temperature_celsius": 60.0})
    assert list(risk_proto(cool).reasons) == []


@pytest.mark.parametrize("name", ["isolation_forest", "pca", "threshold_rule"])
def test_the_online_detector_is_the_offline_one_with_its_scaling(name):
    rng = np.random.default_rng(1)
    rows = [{"power": 300 + rng.normal(0, 5), "util": 0.9 + rng.normal(0, 0.01),
             "flat": 1.0} for _ in range(200)]  # fmt: skip
    forest = FleetForest(fit_samples=200, detector=name)
    for r in rows:
        forest.collect(r)
    forest.fit()
    offline = detectors.ALL[name](seed=0).fit(
        np.array([[r["flat"], r["power"], r["util"]] for r in rows])
    )
    assert type(forest.detector) is type(offline)
    # the same scaler: centre and floored spread from the first 80%, the constant gauge out
    np.testing.assert_array_equal(forest.scaler.centre, offline.scaler.centre)
    np.testing.assert_array_equal(forest.scaler.spread, offline.scaler.spread)
    assert list(forest.scaler.constant) == [True, False, False]
    probe = {"flat": 1.0, "power": 301.0, "util": 0.9}
    raw = offline.score(np.array([[1.0, 301.0, 0.9]]))[0]
    want = np.searchsorted(np.sort(offline.tail_scores), raw) / len(offline.tail_scores)
    assert forest.score(probe)[0] == pytest.approx(want)
    assert forest.score({"flat": 1.0, "power": 150.0, "util": 0.9})[0] == 1.0


def test_only_point_wise_detectors_serve_online():
    with pytest.raises(ValueError, match="isolation_forest, pca, threshold_rule"):
        FleetForest(detector="forecast")


def test_the_anomaly_score_is_recomputed_at_most_every_few_seconds():
    fleet = Fleet(HealthConfig(fit_samples=50, anomaly_every_seconds=2.0))
    for i in range(50):
        fleet.observe(f"n{i % 5}", float(i), i, {"gpu_power_watts": 300.0 + (i % 7)})
    fleet.forest.fit()
    a, _ = fleet.observe("n1", 60.0, 60, {"gpu_power_watts": 300.0})
    b, _ = fleet.observe("n1", 61.0, 61, {"gpu_power_watts": 100.0})  # 1 s later: kept
    c, _ = fleet.observe("n1", 62.5, 62, {"gpu_power_watts": 100.0})  # 2.5 s: scored
    assert a.anomaly < 1.0 and b.anomaly == a.anomaly and c.anomaly == 1.0
    # the rules are not throttled: a hot GPU counts on the sample that shows it
    d, _ = fleet.observe("n1", 63.0, 63, {"gpu_power_watts": 100.0, "gpu_temperature_celsius": 95})
    assert d.risk == 1.0 and d.top_signals[0] == "gpu_temperature_celsius"


def _drive(fleet, t0, seconds, level, odd=None, odd_level=None, noise=1.0, seen=None):
    """Four nodes, five samples a second each; ``odd`` reads ``odd_level`` instead.
    Returns each node's last assessment; ``seen`` (a dict) gets every one, per node."""
    rng = np.random.default_rng(int(t0))
    last = {}
    for k in range(int(seconds * 5)):
        t = t0 + k / 5
        for n in ("n0", "n1", "n2", "n3"):
            lvl = odd_level if n == odd else level
            last[n], _ = fleet.observe(n, t, k, {
                "cpu_percent": lvl + rng.normal(0, 0.5 * noise),
                "system_memory_percent": lvl / 2 + rng.normal(0, 0.05 * noise)})  # fmt: skip
            if seen is not None:
                seen.setdefault(n, []).append(last[n])
    return last


def _share_departing(assessments) -> float:
    """The share of assessments naming a gauge 3 robust spreads or more from normal
    (a node is scored every 2 s, and a score stands for the samples until the next)."""
    return sum(bool(a.top_signals) for a in assessments) / len(assessments)


def _fit_if_due(fleet, now):
    samples = fleet.fit_samples(now)
    if samples is not None:
        fleet.forest.fit(samples)
    return samples is not None


def test_a_fleet_drifting_together_stays_normal():
    fleet = Fleet(HealthConfig(fit_samples=200, refit_min_seconds=60.0))
    _drive(fleet, 0.0, 10, level=40.0)
    assert _fit_if_due(fleet, 10.0) and fleet.forest.fits == 1
    # the whole idle fleet moves far off the level it was fitted on, together: the
    # detector measures each node from the fleet's median, so nobody stands out
    seen = {}
    _drive(fleet, 100.0, 10, level=60.0, seen=seen)
    assert max(_share_departing(a) for a in seen.values()) <= 0.2  # one scoring in 5
    assert fleet.fit_samples(110.0) is None and fleet.forest.fits == 1


def test_a_fleet_whose_spread_grows_together_gets_a_fresh_reference():
    fleet = Fleet(HealthConfig(fit_samples=200, refit_min_seconds=60.0))
    _drive(fleet, 0.0, 10, level=40.0)
    assert _fit_if_due(fleet, 10.0)
    # every node gets ten times noisier at once: most depart from the median by more
    # than the reference knew, which is the reference going stale, not a sick node
    noisy = _drive(fleet, 100.0, 10, level=40.0, noise=10.0)
    assert sum(a.anomaly >= 0.995 for a in noisy.values()) > 2
    assert _fit_if_due(fleet, 110.0) and fleet.forest.fits == 2
    # at most one refit per refit_min_seconds, however the fleet moves meanwhile
    _drive(fleet, 120.0, 10, level=40.0, noise=100.0)
    assert fleet.fit_samples(130.0) is None


def test_a_lone_node_has_no_peers_to_depart_from():
    fleet = Fleet(HealthConfig(fit_samples=50))
    for i in range(100):
        a, drafts = fleet.observe("n0", i / 5, i, {"cpu_percent": 40.0 + (i % 7)})
        fleet.forest.fit() if fleet.ready_to_fit else None
    assert not fleet.forest.fitted  # every departure is zero: nothing to fit on
    assert a.anomaly == 0.0 and drafts == []


def test_one_node_leaving_its_peers_keeps_the_reference_and_stays_anomalous():
    fleet = Fleet(HealthConfig(fit_samples=200, refit_min_seconds=60.0))
    _drive(fleet, 0.0, 10, level=40.0)
    assert _fit_if_due(fleet, 10.0)
    seen = {}
    last = _drive(fleet, 100.0, 10, level=40.0, odd="n2", odd_level=70.0, seen=seen)
    assert last["n2"].anomaly == 1.0
    assert set(last["n2"].top_signals) == {"cpu_percent", "system_memory_percent"}
    assert fleet._relative["n2"]["cpu_percent"] == pytest.approx(30, abs=3)  # from the median
    assert _share_departing(seen["n2"]) > 0.9
    assert max(_share_departing(seen[n]) for n in ("n0", "n1", "n3")) <= 0.2
    assert fleet.fit_samples(110.0) is None  # one node in four: not the fleet
    assert fleet.forest.fits == 1


def test_no_refit_before_the_detector_has_a_full_window_of_new_samples():
    fleet = Fleet(HealthConfig(fit_samples=200))
    assert fleet.fit_samples(0.0) is None  # nothing collected yet
    _drive(fleet, 0.0, 10, level=40.0)
    assert len(fleet.fit_samples(10.0)) == 200
    fleet.forest.fit(None)  # the pending samples, as the first fit takes them
    assert fleet.forest.fits == 1 and fleet.fit_samples(100.0) is None  # recent is empty


def test_a_full_fleet_refuses_a_new_node_until_one_goes_quiet():
    """Invented node ids cannot grow the service: past max_nodes a new id is refused
    while every tracked node is live, and takes the place of one silent for
    forget_after_seconds (its window and assessment go; a corruption report stays)."""
    fleet = Fleet(HealthConfig(max_nodes=2, forget_after_seconds=60))
    fleet.observe("a", 0.0, 0, {"loss": 1.0})
    fleet.report_corruption("a", "outvoted", 0.5)
    fleet.observe("b", 50.0, 0, {"loss": 1.0})
    with pytest.raises(FleetFull, match="2 nodes tracked"):
        fleet.observe("c", 59.0, 0, {"loss": 1.0})
    fleet.observe("a", 59.0, 1, {"loss": 1.0})  # known nodes are never refused
    with pytest.raises(FleetFull):
        fleet.observe("c", 100.0, 0, {"loss": 1.0})  # a heard from 41 s ago, b 50
    fleet.observe("b", 110.0, 1, {"loss": 1.0})
    fleet.observe("c", 120.0, 0, {"loss": 1.0})  # a silent for 61 s: forgotten
    assert sorted(fleet.windows) == ["b", "c"] and sorted(fleet.assessments) == ["b", "c"]
    assert fleet.forgotten == ["a"] and "a" in fleet.corrupt
    assert fleet.observe("a", 300.0, 2, {"loss": 1.0})[0].risk == 1.0  # b, c quiet; sticky


def test_the_adapter_refuses_a_full_fleet_and_drops_forgotten_gauges():
    from services.health.servicer import RISK, HealthServicer
    from services.health.settings import HealthSettings

    svc = HealthServicer(HealthSettings(max_nodes=1, forget_after_seconds=10))

    def sample(node):
        return coordinator.TelemetrySample(node_id=node, step=1, metrics={"loss": 1.0})

    def risk_series():
        return {s.labels["node"] for m in RISK.collect() for s in m.samples}

    svc.ingest(sample("old-node"), 0.0)
    assert "old-node" in risk_series()
    with pytest.raises(StalwartError) as refused:
        svc.ingest(sample("new-node"), 5.0)
    assert refused.value.kind is ErrorKind.LIMIT_EXCEEDED and "--max-nodes" in str(refused.value)
    svc.ingest(sample("new-node"), 20.0)
    assert "old-node" not in risk_series() and "new-node" in risk_series()


def test_corruption_reports_about_invented_nodes_are_capped_not_forgotten():
    """Reports are sticky, so none is dropped to make room: past max_nodes reported
    nodes a report about another one is refused, one about a known node still lands,
    and the adapter answers RESOURCE_EXHAUSTED."""
    from services.health.servicer import HealthServicer
    from services.health.settings import HealthSettings

    fleet = Fleet(HealthConfig(max_nodes=2))
    fleet.report_corruption("a", "outvoted", 0.0)
    fleet.report_corruption("b", "outvoted", 1.0)
    with pytest.raises(FleetFull, match="corruption reported about 2 nodes"):
        fleet.report_corruption("c", "outvoted", 2.0)
    fleet.report_corruption("a", "outvoted again", 3.0)
    assert fleet.corrupt == {"a": "outvoted again", "b": "outvoted"}
    assert sorted(fleet.assessments) == ["a", "b"]

    svc = HealthServicer(HealthSettings(max_nodes=1))
    raise_alert = HealthServicer.RaiseAlert.__wrapped__  # without the gRPC status mapping

    def report(node):
        request = health.RaiseAlertRequest(node_id=node, message="bad sum")
        return asyncio.run(raise_alert(svc, request, None))

    assert report("n1").alert.node_id == "n1"
    with pytest.raises(StalwartError) as refused:
        report("n2")
    assert refused.value.kind is ErrorKind.LIMIT_EXCEEDED and "--max-nodes" in str(refused.value)
    assert list(svc.fleet.corrupt) == ["n1"]
