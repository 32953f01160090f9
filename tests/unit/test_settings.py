"""ServiceSettings: flags, env vars, defaults, and what is refused."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest

from stalwart.settings import MIB, ServiceSettings


class WorkerSettings(ServiceSettings):
    """A subclass, as a service would write it."""

    store_url: str = "shm:///dev/shm/stalwart"
    """Where checkpoints go."""


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("STALWART_"):
            monkeypatch.delenv(key)


def test_defaults() -> None:
    s = ServiceSettings.from_args([])
    assert (s.host, s.port, s.metrics_port) == ("127.0.0.1", 0, 0)
    assert s.max_message_bytes == 8 * MIB and s.chunk_bytes == 4 * MIB
    assert s.ready_file is None and not s.insecure
    assert not s.tls_enabled and not s.auth_enabled
    assert s.node_id


def test_node_ids_differ_between_processes() -> None:
    assert ServiceSettings().node_id != ServiceSettings().node_id


@pytest.mark.parametrize(
    ("env", "argv", "expected"),
    [
        ({}, [], 0),
        ({"STALWART_PORT": "7001"}, [], 7001),
        ({"STALWART_PORT": "7001"}, ["--port", "7002"], 7002),
        ({}, ["--port", "7002"], 7002),
    ],
)
def test_precedence_flag_then_env_then_default(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], argv: list[str], expected: int
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert ServiceSettings.from_args(argv).port == expected


def test_kebab_case_flags_and_boolean_switches(tmp_path: Path) -> None:
    ready = tmp_path / "ready.json"
    s = ServiceSettings.from_args(
        ["--ready-file", str(ready), "--insecure", "--metrics-port", "-1", "--grace-seconds", "2"]
    )
    assert s.ready_file == ready and s.insecure
    assert s.metrics_port == -1 and s.grace_seconds == 2.0
    assert not ServiceSettings.from_args(["--no-insecure"]).insecure


def test_subclass_gets_flags_and_env_for_its_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STALWART_STORE_URL", "redis://r:6379/0")
    assert WorkerSettings.from_args([]).store_url == "redis://r:6379/0"
    s = WorkerSettings.from_args(["--store-url", "file:///x", "--port", "9"])
    assert (s.store_url, s.port) == ("file:///x", 9)


def test_tokens_are_secret_and_turn_auth_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STALWART_ADMIN_TOKEN", "s3cret")
    s = ServiceSettings.from_args([])
    assert s.auth_enabled
    assert s.admin_token.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(s)


def test_frozen() -> None:
    s = ServiceSettings()
    with pytest.raises(pydantic.ValidationError):
        s.port = 5  # type: ignore[misc]


def test_unknown_flag_exits_like_argparse(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        ServiceSettings.from_args(["--no-such-flag", "1"])
    assert info.value.code == 2
    assert "--no-such-flag" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["--port", "70000"],
        ["--metrics-port", "-2"],
        ["--tls-cert", "c.pem"],  # key missing
        ["--tls-ca", "ca.pem"],  # mTLS without our own certificate
        ["--chunk-bytes", str(8 * MIB)],  # a chunk must fit in a message
        ["--log-level", "loud"],
    ],
)
def test_bad_values_are_refused(argv: list[str]) -> None:
    with pytest.raises(pydantic.ValidationError):
        ServiceSettings.from_args(argv)


def test_every_field_has_a_docstring() -> None:
    for name, info in ServiceSettings.model_fields.items():
        assert info.description, f"{name} has no docstring"
