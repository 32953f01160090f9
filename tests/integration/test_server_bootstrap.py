"""The shared bootstrap, end to end: a real process on loopback, real clients."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from stalwart import api
from stalwart.channel import ChannelConfig, call_with_deadline, open_channel, open_sync_channel
from stalwart.errors import ErrorKind, RpcError
from stalwart.procs import ServiceProcess, ServiceStartError, start_service
from tests.helpers import assert_eventually

MODULE = "tests.integration.fixtures_echo_service"
ROOT = Path(__file__).resolve().parents[2]
TRAINER = "stalwart.v1.TrainerService"
MONITOR = "stalwart.v1.HealthMonitorService"
TOKENS = {
    "STALWART_ADMIN_TOKEN": "adm-token",
    "STALWART_NODE_TOKEN": "node-token",
    "STALWART_VIEWER_TOKEN": "viewer-token",
}


def _start(
    run_dir: Path, name: str, *args: str, env: dict[str, str] | None = None, preload: bool = False
):
    return start_service(
        MODULE, list(args), run_dir, name, env=env, timeout=30, cwd=ROOT, preload=preload
    )


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bootstrap")


@pytest.fixture(scope="module")
def echo(run_dir: Path):
    with _start(run_dir, "echo", "--job-id", "job-7") as proc:
        yield proc


@pytest.fixture(scope="module")
def secured(run_dir: Path):
    with _start(run_dir, "secured", env=TOKENS) as proc:
        yield proc


def _trainer(channel: grpc.aio.Channel):
    return api.trainer_grpc.TrainerServiceStub(channel)


async def _rpc_error(coro) -> RpcError:
    with pytest.raises(RpcError) as info:
        await coro
    return info.value


def _scrape(proc: ServiceProcess) -> str:
    url = f"http://127.0.0.1:{proc.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()


def _scrape_until(proc: ServiceProcess, *needles: str) -> str:
    """The metrics page once it shows every needle: the server records a call
    after its answer has left, so a scrape right after the call can be early."""
    assert_eventually(lambda: all(n in _scrape(proc) for n in needles), timeout=5)
    return _scrape(proc)


# --- serving basics -------------------------------------------------------------------


def test_ready_file_describes_the_process(echo: ServiceProcess) -> None:
    ready = json.loads(echo.ready_file.read_text())
    assert ready["address"].startswith("127.0.0.1:") and ready["pid"] == echo.pid
    assert ready["metrics_port"] > 0 and ready["node_id"] and ready["tls"] is False


def test_health_reports_serving_for_each_service(echo: ServiceProcess) -> None:
    with open_sync_channel(echo.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", TRAINER, MONITOR):
            request = health_pb2.HealthCheckRequest(service=service)
            assert stub.Check(request, timeout=5).status == health_pb2.HealthCheckResponse.SERVING


def test_reflection_lists_the_services(echo: ServiceProcess) -> None:
    with open_sync_channel(echo.address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        (answer,) = list(stub.ServerReflectionInfo(iter([request]), timeout=5))
    names = {s.name for s in answer.list_services_response.service}
    assert {TRAINER, MONITOR, "grpc.health.v1.Health"} <= names


def test_unary_call_and_metrics(echo: ServiceProcess) -> None:
    async def call() -> api.trainer.GetTrainerStatusResponse:
        async with open_channel(echo.address) as channel:
            rpc = _trainer(channel).GetTrainerStatus
            return await call_with_deadline(rpc, api.trainer.GetTrainerStatusRequest(), 5)

    status = asyncio.run(call())
    assert (status.job_id, status.slot, status.node_id) == ("job-7", 3, echo.node_id)
    expected = (
        'grpc_server_handled_total{grpc_code="OK",grpc_method="GetTrainerStatus",'
        f'grpc_service="{TRAINER}",grpc_type="UNARY"}}'
    )
    assert_eventually(lambda: expected in _scrape(echo), timeout=5)
    assert "grpc_server_handling_seconds_bucket" in _scrape(echo)


def test_every_call_needs_a_deadline(echo: ServiceProcess) -> None:
    async def call() -> None:
        async with open_channel(echo.address) as channel:
            await _trainer(channel).GetTrainerStatus(api.trainer.GetTrainerStatusRequest())

    with pytest.raises(ValueError, match="timeout"):
        asyncio.run(call())


# --- errors -----------------------------------------------------------------------------


def test_stalwart_error_reaches_client_with_reason(echo: ServiceProcess) -> None:
    async def call() -> RpcError:
        async with open_channel(echo.address) as channel:
            rpc = _trainer(channel).StopTrainer
            return await _rpc_error(call_with_deadline(rpc, api.trainer.StopTrainerRequest(), 5))

    err = asyncio.run(call())
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION
    assert err.kind is ErrorKind.FENCED and err.metadata == {"epoch": "7"}
    assert err.message == "replica is fenced"
    _scrape_until(
        echo,
        'grpc_code="FAILED_PRECONDITION",grpc_method="StopTrainer"',
        'stalwart_rpc_errors_total{reason="FENCED"} 1.0',  # every reason starts at 0
    )
    # The error line carries the RPC from the log context each call starts with.
    lines = [json.loads(line) for line in echo.log_path.read_text().splitlines() if "{" in line]
    assert any(
        line.get("reason") == "FENCED" and line.get("rpc", "").endswith("/StopTrainer")
        for line in lines
    )


def test_server_stream_yields_then_fails_with_reason(echo: ServiceProcess) -> None:
    async def call() -> tuple[int, RpcError]:
        received = 0
        async with open_channel(echo.address) as channel:
            stub = api.health_grpc.HealthMonitorServiceStub(channel)
            stream = stub.WatchAlerts(api.health.WatchAlertsRequest(), timeout=5)
            try:
                async for _ in stream:
                    received += 1
            except grpc.RpcError as exc:
                return received, RpcError.from_grpc(exc)
        raise AssertionError("stream ended without the expected error")

    received, err = asyncio.run(call())
    assert received == 2
    assert err.kind is ErrorKind.NOT_LEADER and err.metadata["leader"] == "127.0.0.1:1"
    _scrape_until(
        echo,
        'grpc_code="FAILED_PRECONDITION",grpc_method="WatchAlerts",'
        f'grpc_service="{MONITOR}",grpc_type="SERVER_STREAM"',
    )


def test_unexpected_exception_becomes_internal(echo: ServiceProcess) -> None:
    async def call() -> RpcError:
        async with open_channel(echo.address) as channel:
            rpc = api.health_grpc.HealthMonitorServiceStub(channel).ListAlerts
            return await _rpc_error(call_with_deadline(rpc, api.health.ListAlertsRequest(), 5))

    err = asyncio.run(call())
    assert err.code == grpc.StatusCode.INTERNAL and err.kind is ErrorKind.INTERNAL
    assert "ZeroDivisionError" in err.message
    assert "a bug" not in err.message  # details stay in the server log
    assert "ZeroDivisionError: a bug" in echo.log_path.read_text()


def test_client_stream(echo: ServiceProcess) -> None:
    async def call() -> int:
        async def samples():
            for _ in range(3):
                yield api.health.StreamTelemetryRequest()

        async with open_channel(echo.address) as channel:
            stub = api.health_grpc.HealthMonitorServiceStub(channel)
            response = await stub.StreamTelemetry(samples(), timeout=5)
            return response.samples_accepted

    assert asyncio.run(call()) == 3
    _scrape_until(echo, 'grpc_method="StreamTelemetry",grpc_service')


# --- auth -------------------------------------------------------------------------------


def _status_with(proc: ServiceProcess, token: str | None, stop: bool = False) -> RpcError | None:
    async def call() -> RpcError | None:
        async with open_channel(proc.address, role_token=token) as channel:
            stub = _trainer(channel)
            rpc, request = stub.GetTrainerStatus, api.trainer.GetTrainerStatusRequest()
            if stop:
                rpc, request = stub.StopTrainer, api.trainer.StopTrainerRequest()
            try:
                await call_with_deadline(rpc, request, 5)
            except RpcError as err:
                return err
            return None

    return asyncio.run(call())


def test_missing_or_wrong_token_is_unauthenticated(secured: ServiceProcess) -> None:
    assert _status_with(secured, None).code == grpc.StatusCode.UNAUTHENTICATED
    assert _status_with(secured, "nope").code == grpc.StatusCode.UNAUTHENTICATED
    assert _status_with(secured, "viewer-token") is None


def test_viewer_on_admin_method_is_permission_denied(secured: ServiceProcess) -> None:
    err = _status_with(secured, "viewer-token", stop=True)
    assert err.code == grpc.StatusCode.PERMISSION_DENIED and "admin" in err.message
    # Admin passes the check and reaches the handler (which answers FENCED).
    assert _status_with(secured, "adm-token", stop=True).kind is ErrorKind.FENCED
    _scrape_until(secured, 'grpc_code="PERMISSION_DENIED",grpc_method="StopTrainer"')


def test_health_is_open_without_token(secured: ServiceProcess) -> None:
    with open_sync_channel(secured.address) as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=5
        )
    assert answer.status == health_pb2.HealthCheckResponse.SERVING


# --- lifecycle --------------------------------------------------------------------------


LAUNCHES = pytest.mark.parametrize("preload", [False, True], ids=["exec", "preloaded"])


@LAUNCHES
def test_sigterm_exits_zero_within_grace(run_dir: Path, preload: bool) -> None:
    proc = _start(run_dir, f"graceful-{preload}", "--grace-seconds", "5", preload=preload)
    assert proc.terminate(timeout=5) == 0  # a SIGKILL fallback would give -9
    log_text = proc.log_path.read_text()
    assert "shutdown hook ran" in log_text and '"stopped"' in log_text
    assert not proc.ready_file.exists()


@LAUNCHES
def test_kill_is_immediate(run_dir: Path, preload: bool) -> None:
    proc = _start(run_dir, f"killed-{preload}", preload=preload)
    assert proc.kill() == -9 and not proc.alive()


@LAUNCHES
def test_plaintext_on_non_loopback_is_refused(run_dir: Path, preload: bool) -> None:
    with pytest.raises(ServiceStartError, match="refusing to serve plaintext") as info:
        _start(run_dir, f"exposed-{preload}", "--host", "0.0.0.0", preload=preload)
    assert "status 2" in str(info.value)


def test_a_preloaded_service_has_its_own_session_environment_and_log(run_dir: Path) -> None:
    with _start(run_dir, "forked", "--job-id", "job-9", env=TOKENS, preload=True) as proc:
        ready = json.loads(proc.ready_file.read_text())
        assert ready["pid"] == proc.pid and os.getsid(proc.pid) == proc.pid
        assert _status_with(proc, None).code == grpc.StatusCode.UNAUTHENTICATED  # env applied
        assert '"serving"' in proc.log_path.read_text()  # its own log file
    assert proc.returncode == 0


def test_insecure_allows_plaintext_and_warns(run_dir: Path) -> None:
    with _start(run_dir, "insecure", "--host", "0.0.0.0", "--insecure") as proc:
        assert proc.address.startswith("127.0.0.1:")
        assert "PLAINTEXT" in proc.log_path.read_text()


# --- mTLS -------------------------------------------------------------------------------


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _make_pki(folder: Path) -> None:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by it."""
    folder.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test-ca",
        "-keyout", "ca.key", "-out", "ca.pem", cwd=folder,
    )  # fmt: skip
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1,DNS:localhost"), ("client", "")):
        _openssl(
            "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=folder,
        )  # fmt: skip
        (folder / f"{name}.ext").write_text(ext + "\n" if ext else "basicConstraints=CA:FALSE\n")
        _openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "1", "-extfile", f"{name}.ext", "-out", f"{name}.pem",
            cwd=folder,
        )  # fmt: skip


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl CLI not installed")
def test_mtls(run_dir: Path) -> None:
    pki = run_dir / "pki"
    _make_pki(pki)
    tls = ["--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key")]
    with _start(run_dir, "mtls", *tls, "--tls-ca", str(pki / "ca.pem")) as proc:
        assert proc.ready["tls"] is True
        good = ChannelConfig(pki / "client.pem", pki / "client.key", pki / "ca.pem")
        no_client_cert = ChannelConfig(tls_ca=pki / "ca.pem")

        async def status(config: ChannelConfig) -> str:
            async with open_channel(proc.address, config) as channel:
                rpc = _trainer(channel).GetTrainerStatus
                answer = await call_with_deadline(rpc, api.trainer.GetTrainerStatusRequest(), 5)
                return answer.job_id

        assert asyncio.run(status(good)) == "job-echo"
        with pytest.raises(RpcError) as info:
            asyncio.run(status(no_client_cert))
        assert info.value.code == grpc.StatusCode.UNAVAILABLE
