"""deploy/docker-compose.yml: valid against the Compose Specification schema and
consistent with the project (images it builds, modules and commands it runs,
STALWART_* variables the services read, ports they serve)."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import yaml

from tests.backends import skip_or_fail
from tests.deploy.project import (
    COMPOSE_SCHEMA,
    DEPLOY,
    DOCKERFILE,
    PENDING_CLI,
    ROOT,
    parse_dockerfile,
    service_module_exists,
    unknown_env,
)

COMPOSE = DEPLOY / "docker-compose.yml"
STALWART_SERVICES = ("paramserver", "coordinator", "trainer", "health")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())  # merge keys (<<) resolved here


def _role(spec: dict) -> str | None:
    """Which Stalwart service a compose service runs: the Dockerfile target it builds."""
    return spec.get("build", {}).get("target")


def test_schema_valid(compose: dict) -> None:
    import jsonschema

    if not COMPOSE_SCHEMA.is_file():
        pytest.fail(f"Compose schema not installed at {COMPOSE_SCHEMA}: run `make deploy-tools`")
    schema = json.loads(COMPOSE_SCHEMA.read_text())
    errors = [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in jsonschema.Draft201909Validator(schema).iter_errors(compose)
    ]
    assert not errors, "\n".join(errors)


def test_compose_cli_accepts_it() -> None:
    """The real Compose parser, where one is installed (no engine needed)."""
    if shutil.which("docker-compose"):
        cmd = ["docker-compose", "-f", str(COMPOSE), "config", "-q"]
    elif (
        shutil.which("docker")
        and subprocess.run(
            ["docker", "compose", "version"], capture_output=True, check=False
        ).returncode
        == 0
    ):
        cmd = ["docker", "compose", "-f", str(COMPOSE), "config", "-q"]
    else:
        skip_or_fail("no docker compose / docker-compose on PATH (make backends installs it)")
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr


def test_topology(compose: dict) -> None:
    roles: dict[str, list[str]] = {}
    for name, spec in compose["services"].items():
        roles.setdefault(_role(spec) or spec["image"].split(":")[0], []).append(name)
    assert len([n for n in roles["coordinator"] if n != "cli"]) == 2
    assert len(roles["paramserver"]) == 2
    assert len(roles["trainer"]) == 4
    standbys = [
        n for n in roles["trainer"]
        if compose["services"][n]["environment"].get("STALWART_STANDBY") == "true"
    ]  # fmt: skip
    assert len(standbys) == 1
    ps_roles = sorted(
        compose["services"][n]["environment"]["STALWART_ROLE"] for n in roles["paramserver"]
    )
    assert ps_roles == ["backup", "primary"]
    for infra in ("apacheignite/ignite", "redis", "prom/prometheus", "grafana/grafana"):
        assert infra in roles, f"{infra} missing"
    assert roles["apacheignite/ignite"] and compose["services"]["ignite"]["image"].split(":")[
        1
    ].startswith("2.")


def test_every_service_is_healthchecked_and_restarted(compose: dict) -> None:
    for name, spec in compose["services"].items():
        if "tools" in spec.get("profiles", []):
            continue  # one-shot commands
        assert spec.get("healthcheck", {}).get("test"), f"{name}: no healthcheck"
        assert spec.get("restart") in ("unless-stopped", "always", "on-failure"), name


def test_depends_on_waits_for_health(compose: dict) -> None:
    services = compose["services"]
    for name, spec in services.items():
        deps = spec.get("depends_on", {})
        assert isinstance(deps, dict), f"{name}: depends_on must use conditions"
        for dep, cond in deps.items():
            assert dep in services, f"{name} depends on unknown {dep}"
            assert cond.get("condition") == "service_healthy", f"{name} -> {dep}"


def test_builds_images_and_runs_modules_that_exist(compose: dict) -> None:
    stages = parse_dockerfile().stages
    for name, spec in compose["services"].items():
        build = spec.get("build")
        if build:
            context = (COMPOSE.parent / build["context"]).resolve()
            assert context == ROOT, f"{name}: context must be the repository root"
            assert (context / build["dockerfile"]) == DOCKERFILE, f"{name}: {build['dockerfile']}"
            target = build.get("target")
            assert target in STALWART_SERVICES and target in stages, f"{name}: target {target}"
            assert spec["image"].split(":")[0] == f"stalwart/{target}", f"{name}: {spec['image']}"
        test = spec.get("healthcheck", {}).get("test", [])
        if test[:3] == ["CMD", "python", "-m"]:
            module = test[3].replace(".", "/")
            assert (ROOT / f"{module}.py").is_file() or (ROOT / module).is_dir(), test


def _flags(healthcheck: str) -> dict[str, str]:
    """HEALTHCHECK --interval=10s ... CMD [...] -> {"interval": "10s", ...}"""
    options = healthcheck.split(" CMD ")[0].split()
    return {
        k.removeprefix("--").replace("-", "_"): v for k, _, v in (o.partition("=") for o in options)
    }


def test_healthchecks_spell_out_the_images(compose: dict) -> None:
    dockerfile = parse_dockerfile()
    for name, spec in compose["services"].items():
        target = _role(spec)
        if not target or "tools" in spec.get("profiles", []):
            continue
        image = dockerfile.last(target, "HEALTHCHECK")
        cmd = json.loads(image.split(" CMD ", 1)[1])
        check = spec["healthcheck"]
        assert check["test"] == ["CMD", *cmd], f"{name}: {check['test']} vs the image's {cmd}"
        for key, value in _flags(image).items():
            assert str(check.get(key)) == value, f"{name}: {key} {check.get(key)} vs {value}"


def test_cli_command_exists(compose: dict) -> None:
    cli = compose["services"]["cli"]
    assert cli["profiles"] == ["tools"] and cli["entrypoint"] == []
    prog, sub = cli["command"][:2]
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert prog in scripts, f"{prog} is not a console script"
    from stalwart.cli.main import app

    names = {c.name or c.callback.__name__ for c in app.registered_commands}
    names |= {g.name for g in app.registered_groups}
    assert sub in names or sub in PENDING_CLI, f"`stalwart {sub}` does not exist"


@pytest.mark.parametrize("service", STALWART_SERVICES)
def test_environment_matches_settings(compose: dict, service: str) -> None:
    specs = {n: s for n, s in compose["services"].items() if _role(s) == service and n != "cli"}
    assert specs, f"no compose service runs {service}"
    names = set().union(*(s.get("environment", {}) for s in specs.values()))
    unknown = unknown_env(service, names)
    if unknown is None:
        pytest.skip(f"services/{service}/settings.py not written yet")
    assert not unknown, f"{service} has no settings for {sorted(unknown)}"
    if not service_module_exists(service):
        pytest.skip(f"services/{service}/__main__.py not written yet")


def test_ports_match_what_services_serve(compose: dict) -> None:
    prom = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    targets = {
        t for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]
    }
    for name, spec in compose["services"].items():
        if not _role(spec) or name == "cli":
            continue
        env = spec["environment"]
        grpc_port, metrics_port = env["STALWART_PORT"], env["STALWART_METRICS_PORT"]
        for port in spec.get("ports", []):
            host_ip, host_port, container = port.split(":")
            assert host_ip == "127.0.0.1", f"{name}: publish on loopback only"
            assert container == grpc_port, f"{name}: publishes {container}, serves {grpc_port}"
        assert f"{name}:{metrics_port}" in targets, f"Prometheus does not scrape {name}"
        assert env["STALWART_INSECURE"] == "true" and env["STALWART_HOST"] == "0.0.0.0"
        assert env.get("STALWART_NODE_ID") == name
    for target in targets:
        host = target.split(":")[0]
        assert host in compose["services"] or host == "127.0.0.1", f"scrape target {target}"


def test_grafana_mounts_exist(compose: dict) -> None:
    for name in ("grafana", "prometheus"):
        for volume in compose["services"][name]["volumes"]:
            src = volume.split(":")[0]
            if src.startswith("./"):
                assert (COMPOSE.parent / src).exists(), f"{name}: {src}"


def test_durable_tier_is_a_named_volume(compose: dict) -> None:
    assert "checkpoints" in compose["volumes"]
    mounts = [
        v for s in compose["services"].values() for v in s.get("volumes", [])
        if v.startswith("checkpoints:")
    ]  # fmt: skip
    assert mounts and all(m == "checkpoints:/var/lib/stalwart/checkpoints" for m in mounts)
    urls = [
        v for s in compose["services"].values() for k, v in s.get("environment", {}).items()
        if isinstance(v, str) and v.startswith("file://")
    ]  # fmt: skip
    assert urls and all(u.startswith("file:///var/lib/stalwart/checkpoints") for u in urls)


def test_trainers_and_coordinators_reach_the_health_service(compose: dict) -> None:
    """Without the address trainers send no telemetry and coordinators read no risk."""
    health = compose["services"]["health"]
    port = health["environment"].get("STALWART_PORT") or compose["x-stalwart-env"]["STALWART_PORT"]
    want = f"health:{port}"
    for name, spec in compose["services"].items():
        if _role(spec) in ("trainer", "coordinator") and name != "cli":
            assert spec["environment"].get("STALWART_HEALTH") == want, name
