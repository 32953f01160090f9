"""User-code errors keep their type, message and the user's file:line (stalwart/usererrors.py)."""

from __future__ import annotations

import pytest

from stalwart import usererrors
from stalwart.errors import ErrorKind, StalwartError


def _user_loss():
    raise ValueError("bad loss")


def test_an_exception_in_user_code_becomes_a_user_code_error():
    with pytest.raises(usererrors.UserCodeError) as info:
        with usererrors.user_code(usererrors.STEP, slot=2, step=7):
            _user_loss()
    e = info.value
    assert (e.phase, e.error_type, e.message, e.slot, e.step) == (
        "step",
        "ValueError",
        "bad loss",
        2,
        7,
    )
    assert e.location.startswith(__file__ + ":") and e.location.endswith(" in _user_loss")


def test_platform_errors_pass_through():
    with pytest.raises(StalwartError):
        with usererrors.user_code(usererrors.STEP):
            raise StalwartError(ErrorKind.UNAVAILABLE, "retry")


def test_a_syntax_error_names_the_users_file():
    with pytest.raises(usererrors.UserCodeError) as info:
        with usererrors.user_code(usererrors.IMPORT):
            compile("def f(:\n", "/somewhere/task.py", "exec")
    assert info.value.location == "/somewhere/task.py:1"


def test_long_messages_are_cut_to_the_limits():
    e = usererrors.UserCodeError("step", "E" * 500, "m" * 5000, "l" * 5000)
    assert (len(e.error_type), len(e.message), len(e.location)) == (128, 1024, 512)
