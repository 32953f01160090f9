"""The test-only fault spec: off by default, parsed strictly."""

import pytest

from services.trainer.faults import Faults
from services.trainer.settings import TrainerSettings


def test_off_by_default():
    settings = TrainerSettings(assignment_file="a.json")
    assert settings.faults == ""
    assert not Faults.parse(settings.faults).active


def test_parse():
    f = Faults.parse("crash_at_step=7, delay_s=0.5")
    assert f.crash_at_step == 7 and f.delay_s == 0.5 and f.active
    f.after_push(7)  # a different fault: nothing happens


@pytest.mark.parametrize("text", ["crash_at=7", "crash_at_step", "crash_at_step=x"])
def test_bad_specs_are_refused(text):
    with pytest.raises(ValueError):
        Faults.parse(text)


def test_exactly_one_work_source():
    with pytest.raises(ValueError):
        TrainerSettings()
    with pytest.raises(ValueError):
        TrainerSettings(coordinator="127.0.0.1:1", assignment_file="a.json")


def test_a_heated_node_reports_heat_and_throttles_from_its_step_on(monkeypatch):
    """heat_from_step: the telemetry climbs 5 C a step and each computed step sleeps
    HEAT_THROTTLE_S (a hot GPU's clocks), so time passes for the health service."""
    from services.trainer import faults

    slept: list[float] = []
    monkeypatch.setattr(faults.time, "sleep", slept.append)
    f = Faults.parse("heat_from_step=4")
    assert f.telemetry(3) == {"gpu_temperature_celsius": 65.0}
    assert f.telemetry(6) == {"gpu_temperature_celsius": 80.0}
    f.before_push(3)
    assert slept == []
    f.before_push(4)
    f.before_push(5)
    assert slept == [faults.HEAT_THROTTLE_S] * 2
