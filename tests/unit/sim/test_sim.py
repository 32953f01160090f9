"""Determinism, inputs, the trace fit, strategy behaviour and the anchors."""

import json

import pytest

from stalwart import sim
from stalwart.sim import inputs, run, trace

SHORT = sim.SimConfig(gpus=(2048, 16_384), days=5, seeds=1)


@pytest.fixture(scope="module")
def measured():
    return inputs.load()


def test_same_seed_same_numbers_other_seed_other_numbers(measured):
    a = sim.simulate(SHORT, measured, None)
    b = sim.simulate(SHORT, measured, None)
    c = sim.simulate(run.SimConfig(gpus=SHORT.gpus, days=5, seeds=1, seed=7), measured, None)
    assert a == b
    assert [r["ettr"] for r in a] != [r["ettr"] for r in c]
    assert {r["strategy"] for r in a} == set(sim.STRATEGIES)


def test_more_standbys_never_hurt_and_none_hurts(measured):
    base = run.SimConfig(
        gpus=(16_384,), days=10, seeds=1, refill="repair", strategies=("stalwart",)
    )
    ettr = [
        sim.simulate(run.SimConfig(**{**base.__dict__, "standbys": k}), measured, None)[0]["ettr"]
        for k in (0, 4, 64)
    ]
    assert ettr[0] < ettr[1] <= ettr[2] + 1e-9
    assert ettr[0] < 0.9  # without a standby a live replica computes two slots: half speed


def test_anchors_land_near_the_published_figures(measured):
    got = {a["anchor"].split()[0]: a for a in sim.anchors(run.SimConfig(seeds=2), measured, None)}
    assert abs(got["Llama"]["simulated_ettr"] - 0.90) < 0.05
    assert abs(got["ByteRobust-like"]["simulated_ettr"] - 0.97) < 0.02


def _write_trace(folder):
    folder.mkdir(parents=True)
    gpu = {"Level": "Hardware Failure", "Class": "GPU", "Desc": "GPU Lost"}
    test = {"Level": "Other Failure", "Class": "Test", "Desc": "Temporarily Offline"}
    events = [
        {"node_id": "a", "event_time": 1.0, "event_type": "fault_start", "fault_type": gpu},
        {"node_id": "b", "event_time": 2.0, "event_type": "fault_start", "fault_type": test},
        {"node_id": "a", "event_time": 2.0, "event_type": "fault_end", "fault_type": gpu},
        {"node_id": "b", "event_time": 3.0, "event_type": "fault_end", "fault_type": test},
        {"node_id": "a", "event_time": 5.0, "event_type": "fault_start", "fault_type": gpu},
        {"node_id": "a", "event_time": 10.0, "event_type": "fault_end", "fault_type": gpu},
    ]
    (folder / "fault_trace.json").write_text(json.dumps(events))


def test_trace_fit_from_the_data_dir(tmp_path, monkeypatch):
    _write_trace(tmp_path / trace.NAME)
    monkeypatch.setenv("STALWART_DATA_DIR", str(tmp_path))
    fit = trace.load_fit()
    assert fit.faults == 2  # the "Test" row is an operation, not a fault
    assert fit.rate_per_gpu_hour == pytest.approx(2 / (400 * 8 * 10 * 24))
    assert fit.repair_median_h == pytest.approx((24 + 120) / 2)
    assert [c.name for c in fit.causes] == ["GPU"]


def test_missing_trace_says_where_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("STALWART_DATA_DIR", str(tmp_path))
    with pytest.raises(trace.TraceMissing, match="STALWART_DATA_DIR") as err:
        trace.load_fit()
    assert "\n" not in str(err.value) and "InfiniteHBD-Trace" in str(err.value)


def test_inputs_from_benchmark_json(tmp_path):
    rec = tmp_path / "rec.json"
    rec.write_text(
        json.dumps(
            {
                "kill_to_next_commit": {
                    "trainer": {"median_s": 0.9, "median_detection_s": 0.5},
                    "paramserver": {"median_s": 1.1},
                }
            }
        )
    )
    ddp = tmp_path / "ddp.json"
    ddp.write_text(json.dumps({"ratio": 0.8, "ddp_recovery_s": 12.0}))
    health = tmp_path / "h.json"
    health.write_text(json.dumps({"precision": 0.5, "recall": 0.7, "lead_time_h": 2.0}))
    m = inputs.load(recovery=rec, ddp=ddp, health=health)
    assert (m.trainer_takeover_s, m.detection_s, m.ps_promotion_s) == (0.9, 0.5, 1.1)
    assert (m.throughput_ratio, m.ddp_restart_s) == (0.8, 12.0)
    assert (m.precision, m.recall, m.lead_time_h) == (0.5, 0.7, 2.0)
    assert m.sources["ddp"] == str(ddp)


def test_inputs_reject_what_lacks_the_figures(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"ratio": "fast"}))
    with pytest.raises(inputs.InputError, match="not a number"):
        inputs.load(ddp=bad)
    bad.write_text("{")
    with pytest.raises(inputs.InputError, match="cannot read"):
        inputs.load(recovery=bad)


def test_pure_code_imports_neither_grpc_nor_torch():
    import subprocess
    import sys

    code = (
        "import sys, stalwart.sim, stalwart.sim.render; "
        "print(any(m in sys.modules for m in ('grpc', 'torch')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_meta_rate_reproduces_its_projected_mttf():
    from stalwart.sim import failures, published

    model = failures.meta(None)
    for gpus, hours in published.META_MTTF_PROJECTED_H.items():
        assert model.mtbf_h(gpus) == pytest.approx(hours, rel=0.05)
    llama = failures.llama3(None)
    assert llama.mtbf_h(16_384) == pytest.approx(54 * 24 / 419)


def test_ettr_and_waste_account_for_all_wall_time(measured):
    for row in sim.simulate(SHORT, measured, None):
        assert row["ettr"] + sum(row["waste"].values()) == pytest.approx(1.0, abs=1e-4), row


@pytest.mark.parametrize("with_anchors,sensitivity_gpus", [(False, None), (True, 2048)])
def test_the_progress_ticks_once_per_planned_seed_run(measured, with_anchors, sensitivity_gpus):
    cfg = sim.SimConfig(gpus=(2048, 4096), days=1, seeds=2)
    ticks = []
    run.document(cfg, measured, None, with_anchors, sensitivity_gpus, tick=lambda: ticks.append(1))
    assert len(ticks) == run.seed_runs(cfg, with_anchors, sensitivity_gpus) > 0
