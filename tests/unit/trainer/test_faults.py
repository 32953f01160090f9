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
