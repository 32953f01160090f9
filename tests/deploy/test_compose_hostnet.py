"""scripts/compose/hostnet.py: the host-network variant make compose-test runs.

It must keep what the real file says (images, healthchecks, start order) and leave
no address that only the private network could resolve."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import yaml

from tests.deploy.project import ROOT

SCRIPT = ROOT / "scripts" / "compose" / "hostnet.py"


@pytest.fixture(scope="module")
def hostnet():
    spec = importlib.util.spec_from_file_location("hostnet", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def real() -> dict:
    return yaml.safe_load((ROOT / "deploy" / "docker-compose.yml").read_text())


@pytest.fixture(scope="module")
def made(hostnet, real):
    return hostnet.variant(real, 27100, Path("/tmp/prometheus.yml"))


def test_every_service_on_host_network(made, real) -> None:
    doc, _ = made
    assert set(doc["services"]) == set(real["services"]) - {"grafana"}
    for name, svc in doc["services"].items():
        assert svc["network_mode"] == "host", name
        assert not {"networks", "ports", "build"} & set(svc), name


def test_no_private_network_address_left(made, real) -> None:
    doc, _ = made
    names = "|".join(map(re.escape, real["services"]))
    for name, svc in doc["services"].items():
        for key, value in (svc.get("environment") or {}).items():
            assert not re.search(rf"\b({names}):\d+", str(value)), f"{name} {key}={value}"


def test_ports_distinct_and_each_service_binds_its_own(made) -> None:
    doc, ports = made
    every = [p for s in ports.values() for p in s.values()]
    assert len(every) == len(set(every))
    for name, svc in doc["services"].items():
        env = svc.get("environment") or {}
        if "STALWART_PORT" in env:
            assert env["STALWART_HOST"] == "127.0.0.1"
            assert int(env["STALWART_PORT"]) == ports[name]["50051"]
            assert env["STALWART_ADVERTISE_ADDRESS"] == f"127.0.0.1:{ports[name]['50051']}"


def test_keeps_the_real_files_choices(made, real) -> None:
    doc, _ = made
    for name, svc in doc["services"].items():
        original = real["services"][name]
        assert svc.get("depends_on") == original.get("depends_on"), name
        assert svc.get("restart") == original.get("restart"), name
        if original.get("image", "").startswith("stalwart/"):
            assert svc["image"] == original["image"]
            assert svc.get("healthcheck") == original.get("healthcheck"), name


def test_prometheus_scrapes_every_stalwart_service(hostnet, made) -> None:
    doc, ports = made
    config = hostnet.prometheus_config(ports)
    targets = {c["labels"]["service"] for c in config["scrape_configs"][0]["static_configs"]}
    stalwart = {
        n for n, s in doc["services"].items() if "STALWART_PORT" in (s.get("environment") or {})
    }
    assert targets == stalwart and len(stalwart) == 9
