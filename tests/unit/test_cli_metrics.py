"""`stalwart job metrics` lines: one per step once every slot reported, evaluations first."""

from __future__ import annotations

from stalwart.api import paramserver
from stalwart.cli.metrics import StepRows, all_lines, record_data


def loss(seq, step, slot, value):
    return paramserver.MetricRecord(
        sequence=seq, loss=paramserver.TrainingLoss(step=step, slot=slot, loss=value)
    )


def evaluation(seq, version, **metrics):
    return paramserver.MetricRecord(
        sequence=seq, evaluation=paramserver.Evaluation(version=version, metrics=metrics)
    )


def test_a_step_is_a_line_once_every_slot_reported():
    rows = StepRows(num_slots=2)
    assert rows.add(loss(1, 0, 1, 3.0)) == []
    assert rows.add(loss(2, 0, 0, 1.0)) == [["loss", 0, "2.0000", "0: 1.0000  1: 3.0000"]]
    assert rows.add(loss(3, 1, 0, 0.5)) == []
    assert rows.add(evaluation(4, 1, accuracy=0.25)) == [["eval", 1, "", "accuracy=0.25"]]
    assert rows.flush() == [["loss", 1, "0.5000", "0: 0.5000"]]  # the slot that never came


def test_all_lines_sorts_by_step_with_an_evaluation_before_its_step():
    records = [loss(1, 1, 0, 2.0), evaluation(2, 1, loss=2.5), loss(3, 0, 0, 4.0)]
    assert [line[:2] for line in all_lines(records, 1)] == [["loss", 0], ["eval", 1], ["loss", 1]]


def test_json_records():
    assert record_data(loss(1, 4, 1, 0.5)) | {"time": ""} == {
        "kind": "loss", "step": 4, "slot": 1, "loss": 0.5, "time": "",
    }  # fmt: skip
    assert record_data(evaluation(2, 8, b=2.0, a=1.0))["metrics"] == {"a": 1.0, "b": 2.0}
