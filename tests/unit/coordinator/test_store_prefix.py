"""A store prefix that leaves no room for the state's fixed keys (the leader lease
``<prefix>/coordinator/leader`` is the longest; keys are at most 200 characters) is
refused when the settings are parsed, naming the limit: one line and exit 2 from the
coordinator's command line, instead of an invalid lease name at every election."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pydantic
import pytest

from services.coordinator.settings import CoordinatorSettings
from services.coordinator.statestore import MAX_PREFIX_CHARS, StateStore
from stalwart.server import settings_errors
from stalwart.stores.common import check_key

ROOT = Path(__file__).resolve().parents[3]


def test_the_longest_prefix_allowed_still_makes_a_valid_lease_name() -> None:
    assert MAX_PREFIX_CHARS == 181
    settings = CoordinatorSettings(store_prefix="/" + "p" * 181 + "/")  # slashes stripped
    lease = StateStore(None, settings.store_prefix).lease_name
    assert len(lease) == 200 and check_key("lease name", lease) == lease


@pytest.mark.parametrize(
    ("prefix", "why"),
    [
        ("p" * 182, "store prefix is 182 characters, at most 181"),
        ("team a", "may hold only A-Z a-z 0-9"),
        ("a//b", "no '//'"),
    ],
)
def test_a_prefix_no_key_fits_under_is_refused_by_the_settings(prefix, why) -> None:
    with pytest.raises(pydantic.ValidationError) as raised:
        CoordinatorSettings(store_prefix=prefix)
    [line] = settings_errors(raised.value)
    assert line.startswith("store_prefix: ") and why in line


def test_the_coordinator_exits_2_with_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "services.coordinator", "--store-prefix", "q" * 200,
         "--metrics-port", "-1"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "Error: invalid settings: store_prefix: store prefix is 200 characters, at most 181: "
        "store keys are at most 200 and the leader lease's is '<prefix>/coordinator/leader'"
    ]
    assert done.stdout == ""
