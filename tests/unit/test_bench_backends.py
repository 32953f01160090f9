"""Starting and stopping a benchmark's backend through its script (fake scripts here)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from stalwart.bench import backends


def _fake_script(folder: Path, body: str) -> None:
    script = folder / "redis.sh"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


def test_a_stop_that_prints_nothing_is_a_clean_stop(tmp_path, monkeypatch):
    log = tmp_path / "calls"
    _fake_script(tmp_path, f'echo "$1" >> {log}\n[ "$1" = start ] && echo redis://127.0.0.1:1/0\n'
                           "exit 0\n")  # fmt: skip
    monkeypatch.setattr(backends, "SCRIPTS", tmp_path)
    with backends.started("redis") as url:
        assert url == "redis://127.0.0.1:1/0"
    assert log.read_text().split() == ["start", "stop"]


def test_a_start_that_prints_no_url_is_refused(tmp_path, monkeypatch):
    _fake_script(tmp_path, "exit 0\n")
    monkeypatch.setattr(backends, "SCRIPTS", tmp_path)
    with pytest.raises(backends.BackendError, match="printed no URL"):
        with backends.started("redis"):
            pass
