"""`stalwart ckpt` on a store: listing and verifying straight from the store, and the
one-line errors with named exit codes when a store or coordinator cannot be reached."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from stalwart import checkpoint as ckpt
from stalwart.api import common
from stalwart.cli.main import app
from stalwart.cli.output import ExitCode
from stalwart.stores import open_store

pytestmark = pytest.mark.timeout(60)


def _publish(url: str, job: str, step: int, parent: str = "") -> str:
    cid = f"{job}.s{step:012d}.abcdef"
    with open_store(url) as store:
        items = [ckpt.TensorItem("w", torch.arange(4096, dtype=torch.float32) * step)]
        refs, stats = ckpt.write_tensors(store, items, chunk_bytes=4096)
        ckpt.publish(store, ckpt.build_manifest(
            job_id=job, checkpoint_id=cid, step=step, tensors=refs, parent_id=parent,
            shards=[common.ShardState(shard=0, version=step)], store_url=url,
            written_bytes=stats.written_bytes,
        ))  # fmt: skip
    return cid


def test_list_show_verify_rm_on_a_store(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    first = _publish(url, "job1", 2)
    second = _publish(url, "job1", 4, parent=first)
    runner = CliRunner()
    listed = runner.invoke(app, ["ckpt", "list", "--job", "job1", "--store-url", url, "-o", "json"])
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.output)
    assert [r["checkpoint_id"] for r in rows] == [second, first]
    assert rows[0]["delta_ratio"] <= 1.0 and rows[0]["parent_id"] == first
    table = runner.invoke(app, ["ckpt", "list", "--job", "job1", "--store-url", url])
    assert "delta" in table.output and "age" in table.output
    ok = runner.invoke(app, ["ckpt", "verify", second, "--store-url", url, "-o", "json"])
    assert ok.exit_code == 0 and json.loads(ok.output)["ok"]
    gone = runner.invoke(app, ["ckpt", "rm", first, "--store-url", url, "-o", "json"])
    assert gone.exit_code == 0, gone.output
    again = runner.invoke(app, ["ckpt", "verify", second, "--store-url", url])
    assert again.exit_code == 0  # no delta depends on a deleted parent


def test_unreachable_store_is_one_line_and_exit_code() -> None:
    result = CliRunner().invoke(
        app,
        ["ckpt", "list", "--job", "j", "--store-url", "redis://127.0.0.1:1/0?connect_timeout=0.5"],
    )
    assert result.exit_code == ExitCode.UNREACHABLE
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:") and "redis://127.0.0.1:1" in lines[0]
    assert "Traceback" not in result.output


def test_unreachable_coordinator_is_one_line_and_exit_code() -> None:
    result = CliRunner().invoke(app, ["ckpt", "list", "-c", "127.0.0.1:1", "--timeout", "0.5"])
    assert result.exit_code == ExitCode.UNREACHABLE
    assert result.output.startswith("Error:") and "Traceback" not in result.output


def test_a_missing_directory_store_is_refused_not_made(tmp_path: Path) -> None:
    missing = tmp_path / "no-store"
    result = CliRunner().invoke(
        app, ["ckpt", "list", "-j", "j", "--store-url", f"file://{missing}"]
    )
    assert result.exit_code == ExitCode.INVALID_INPUT
    assert (
        result.output.strip() == f"Error: no store at file://{missing}: {missing} is not a folder"
    )
    assert not missing.exists()


def test_a_folder_without_a_store_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    """A mistyped path to an existing folder used to list nothing and leave chunks/,
    manifests/, kv/ and leases/ behind in it."""
    (tmp_path / "notes.txt").write_text("mine")
    result = CliRunner().invoke(
        app, ["ckpt", "list", "-j", "j", "--store-url", f"shm://{tmp_path}"]
    )
    assert result.exit_code == ExitCode.INVALID_INPUT
    assert result.output.strip() == (
        f"Error: no store at shm://{tmp_path}: {tmp_path} lacks a store's folders "
        "(chunks/, manifests/, kv/, leases/)"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_a_folder_store_is_read(tmp_path: Path) -> None:
    open_store(f"shm://{tmp_path}").close()  # what a cluster makes
    result = CliRunner().invoke(
        app, ["ckpt", "list", "-j", "j", "--store-url", f"shm://{tmp_path}", "-o", "json"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == []
