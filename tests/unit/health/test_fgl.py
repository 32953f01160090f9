"""Future-Guided Learning on a small generated fleet, fixed seeds."""

import numpy as np
import pytest
import torch

from services.health import eval_prediction, fgl, transceiver
from services.health.datasets import PredictionSet


@pytest.fixture(scope="module")
def small_fleet():
    return PredictionSet(
        "transceiver", list(transceiver.CHANNELS),
        transceiver.generate(100, 11, prefix="a"), transceiver.generate(50, 12, prefix="b"),
        transceiver.HORIZON_H, "hours", transceiver.STEP_H,
        {"counters": ["fec_corrected", "fec_uncorrected", "link_flaps"]},
    )


@pytest.fixture(scope="module")
def result(small_fleet, monkeypatch_module):
    monkeypatch_module.setitem(eval_prediction.SETTINGS["transceiver"], "stride", 4)
    torch.set_num_threads(1)
    return eval_prediction.run(small_fleet, 0, fgl.TrainConfig(epochs=4),
                               methods=["fgl_student", "lstm", "threshold_rule"])


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def test_student_predicts_precursor_failures_hours_ahead(result):
    s = result["methods"]["fgl_student"]
    assert s["precursor_ge_2h"]["f1"] > 0.75
    assert s["entity"]["mean_lead"] > 3.0  # hours
    # sudden deaths give no warning: catching most of them would mean leaked labels
    assert s["sudden_death"]["recall"] < 0.5


def test_every_method_is_reported_on_the_same_test_entities(result):
    ms = result["methods"]
    assert {"fgl_student", "lstm", "threshold_rule", "fgl_teacher_not_deployable"} <= set(ms)
    assert len({m["entity"]["positives"] for m in ms.values()}) == 1


def test_teacher_sees_the_future_and_is_frozen(small_fleet):
    (fit, _), _, _ = eval_prediction._build(small_fleet, 0)
    idx = np.arange(0, len(fit.end), 8)
    assert (fit.future_end >= fit.end).all() and (fit.future_end > fit.end).any()
    teacher, student = fgl.train_fgl(fit, idx, fgl.TrainConfig(epochs=1))
    assert not any(p.requires_grad for p in teacher.parameters())
    assert all(p.requires_grad for p in student.parameters())
    p = fgl.predict_proba(student, fit, idx)
    assert p.shape == idx.shape and ((p >= 0) & (p <= 1)).all()
