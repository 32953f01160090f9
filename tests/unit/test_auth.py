"""The role table and the authorization decision (no network)."""

from __future__ import annotations

import grpc
import pytest

from stalwart import api
from stalwart.auth import (
    METHOD_ROLES,
    Role,
    authorize,
    bearer_token,
    required_role,
    token_metadata,
)

TOKENS = {Role.ADMIN: "adm", Role.NODE: "nod", Role.VIEWER: "vie"}
NO_TOKENS = {Role.ADMIN: "", Role.NODE: "", Role.VIEWER: ""}


def _proto_methods() -> set[str]:
    modules = (api.coordinator, api.paramserver, api.trainer, api.health)
    return {
        f"/{service.full_name}/{method.name}"
        for module in modules
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }


def test_table_covers_exactly_the_rpcs_in_the_protos() -> None:
    assert set(METHOD_ROLES) == _proto_methods()


@pytest.mark.parametrize(
    ("method", "role"),
    [
        ("/stalwart.v1.CoordinatorService/CreateJob", Role.ADMIN),
        ("/stalwart.v1.CoordinatorService/DrainNode", Role.ADMIN),
        ("/stalwart.v1.CoordinatorService/Heartbeat", Role.NODE),
        ("/stalwart.v1.CoordinatorService/WatchEvents", Role.VIEWER),
        ("/stalwart.v1.ParamServerService/Push", Role.NODE),
        ("/stalwart.v1.ParamServerService/Pull", Role.NODE),
        ("/stalwart.v1.ParamServerService/Promote", Role.ADMIN),
        ("/stalwart.v1.HealthMonitorService/StreamTelemetry", Role.NODE),
        ("/stalwart.v1.TrainerService/GetTrainerStatus", Role.VIEWER),
    ],
)
def test_required_roles(method: str, role: Role) -> None:
    assert required_role(method) == role


def test_unknown_method_needs_admin() -> None:
    assert required_role("/stalwart.v1.CoordinatorService/Brand New") == Role.ADMIN


@pytest.mark.parametrize(
    "method",
    [
        "/grpc.health.v1.Health/Check",
        "/grpc.health.v1.Health/Watch",
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    ],
)
def test_health_and_reflection_are_always_open(method: str) -> None:
    assert authorize(method, None, TOKENS).allowed


def test_no_tokens_configured_means_check_off() -> None:
    assert authorize("/stalwart.v1.CoordinatorService/CreateJob", None, NO_TOKENS).allowed


@pytest.mark.parametrize(
    ("token", "method", "code"),
    [
        (None, "/stalwart.v1.TrainerService/GetTrainerStatus", grpc.StatusCode.UNAUTHENTICATED),
        ("", "/stalwart.v1.TrainerService/GetTrainerStatus", grpc.StatusCode.UNAUTHENTICATED),
        ("wrong", "/stalwart.v1.TrainerService/GetTrainerStatus", grpc.StatusCode.UNAUTHENTICATED),
        ("vie", "/stalwart.v1.TrainerService/GetTrainerStatus", None),
        ("vie", "/stalwart.v1.ParamServerService/Push", grpc.StatusCode.PERMISSION_DENIED),
        ("vie", "/stalwart.v1.TrainerService/StopTrainer", grpc.StatusCode.PERMISSION_DENIED),
        ("nod", "/stalwart.v1.ParamServerService/Push", None),
        ("nod", "/stalwart.v1.CoordinatorService/ListJobs", None),
        ("nod", "/stalwart.v1.CoordinatorService/CancelJob", grpc.StatusCode.PERMISSION_DENIED),
        ("adm", "/stalwart.v1.CoordinatorService/CancelJob", None),
        ("adm", "/stalwart.v1.ParamServerService/Push", None),
        ("adm", "/stalwart.v1.HealthMonitorService/WatchAlerts", None),
    ],
)
def test_decisions(token: str | None, method: str, code: grpc.StatusCode | None) -> None:
    decision = authorize(method, token, TOKENS)
    assert decision.code == code
    if code is not None:
        assert decision.message


def test_permission_denied_message_names_roles() -> None:
    decision = authorize("/stalwart.v1.TrainerService/StopTrainer", "vie", TOKENS)
    assert "viewer" in decision.message and "admin" in decision.message


def test_only_configured_roles_can_authenticate() -> None:
    tokens = {Role.ADMIN: "adm", Role.NODE: "", Role.VIEWER: ""}
    # An empty node token must not match an empty presented token.
    assert authorize("/stalwart.v1.ParamServerService/Push", "", tokens).code == (
        grpc.StatusCode.UNAUTHENTICATED
    )
    assert authorize("/stalwart.v1.ParamServerService/Push", "adm", tokens).allowed


def test_bearer_header_round_trip() -> None:
    metadata = (("user-agent", "x"), *token_metadata("abc"))
    assert bearer_token(metadata) == "abc"
    assert bearer_token((("authorization", "Basic abc"),)) is None
    assert bearer_token(()) is None
