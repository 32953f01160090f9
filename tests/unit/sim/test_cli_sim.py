"""``stalwart sim ettr``: JSON for scripts, one Error line and exit 2 for bad input."""

import json

import pytest
from typer.testing import CliRunner

from stalwart.cli.main import app

runner = CliRunner()


def test_json_and_html(tmp_path):
    page = tmp_path / "ettr.html"
    args = "sim ettr --gpus 1024,4096 --days 2 --seeds 1 --no-anchors --replica-gpus 64 -o json"
    res = runner.invoke(app, [*args.split(), "--html", str(page)])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert {(r["gpus"], r["strategy"]) for r in doc["results"]} >= {
        (1024, "stalwart"),
        (4096, "restart-all"),
    }
    assert all(0 < r["ettr"] <= 1 for r in doc["results"])
    assert doc["inputs"]["measured"]["sources"]["recovery"].startswith("stalwart bench recovery")
    assert doc["inputs"]["workload"]["replica_gpus"] == 64
    text = page.read_text()
    assert text.count("<svg") == 2 and "<script" not in text


@pytest.mark.parametrize("data", ["shared", "absent"])
def test_bad_input_is_one_error_line(data, tmp_path, monkeypatch):
    if data == "absent":  # a fresh clone without the data sets: still one line
        monkeypatch.setenv("STALWART_DATA_DIR", str(tmp_path))
    for args in (
        ["--gpus", "lots"],
        ["--gpus", "1024,4"],
        ["--gpus", ","],
        ["--gpus", "64", "--replica-gpus", "128"],  # not one whole replica
        ["--sensitivity", "99999999"],  # ran for hours
        ["--sensitivity", "1"],
        ["--sensitivity", "512", "--replica-gpus", "1024"],
        ["--strategies", "magic"],
        ["--failures", "dice"],
        ["--html", "/nonexistent/folder/x.html"],
    ):
        res = runner.invoke(app, ["sim", "ettr", *args])
        assert res.exit_code == 2, args
        assert res.stderr.strip().startswith("Error: ") and res.stderr.count("\n") == 1
