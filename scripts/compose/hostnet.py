"""Write a host-network variant of deploy/docker-compose.yml.

An engine started with ``--bridge=none`` cannot make the compose file's private
network, so every container shares the host's network namespace instead. Then
each service needs ports of its own on 127.0.0.1, and every address the file
spells as ``service:port`` becomes ``127.0.0.1:hostport``. Everything else (the
images' targets, environment, healthchecks, restart policies, start order,
volumes) is taken from the real file, so the test runs what users run.

Images that cannot be pulled here are replaced by ones built from the same base
(deploy/docker/backends.Dockerfile): Redis, Ignite and Prometheus; Grafana has no
Debian package and is left out. Prometheus gets a configuration that scrapes
every Stalwart service of the variant.

    python scripts/compose/hostnet.py OUT_DIR --port-base 27100
writes OUT_DIR/docker-compose.yml, OUT_DIR/prometheus.yml and OUT_DIR/ports.json.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "deploy" / "docker-compose.yml"
GRPC, METRICS = "50051", "9100"  # the ports every Stalwart container serves inside
LEFT_OUT = {"grafana"}  # no Debian package, nothing to pull: not in the variant


def assign_ports(services: dict, base: int) -> dict[str, dict[str, int]]:
    """Host ports per service: gRPC and metrics for Stalwart services, one per backend."""
    ports: dict[str, dict[str, int]] = {}
    stalwart = [n for n, s in services.items() if "STALWART_PORT" in (s.get("environment") or {})]
    for i, name in enumerate(sorted(stalwart)):
        ports[name] = {GRPC: base + i, METRICS: base + 100 + i}
    ports["redis"] = {"6379": base + 90}
    ports["ignite"] = {"10800": base + 91, "discovery": base + 92, "communication": base + 93}
    ports["prometheus"] = {"9090": base + 95}
    return ports


def rewrite(value: str, ports: dict[str, dict[str, int]]) -> str:
    """``service:port`` (also inside URLs and comma lists) -> ``127.0.0.1:hostport``."""

    def one(match: re.Match) -> str:
        host, port = match.group(1), match.group(2)
        mapped = ports.get(host, {}).get(port)
        return f"127.0.0.1:{mapped}" if mapped else match.group(0)

    return re.sub(r"\b([a-z][a-z0-9-]*):(\d+)\b", one, value)


def stalwart_service(name: str, svc: dict, ports: dict[str, dict[str, int]]) -> dict:
    env = {k: rewrite(str(v), ports) for k, v in (svc.get("environment") or {}).items()}
    if name in ports and GRPC in ports[name]:
        env["STALWART_HOST"] = "127.0.0.1"  # the host's namespace: loopback only
        env["STALWART_PORT"] = str(ports[name][GRPC])
        env["STALWART_METRICS_PORT"] = str(ports[name][METRICS])
        env["STALWART_ADVERTISE_ADDRESS"] = f"127.0.0.1:{ports[name][GRPC]}"
    svc["environment"] = env
    return svc


def backend_services(ports: dict[str, dict[str, int]], prometheus_yml: Path) -> dict:
    """Redis, Ignite and Prometheus as the variant runs them (images built locally)."""
    r, i, p = ports["redis"]["6379"], ports["ignite"], ports["prometheus"]["9090"]
    py_get = "import urllib.request as u; u.urlopen('http://127.0.0.1:{}/-/ready', timeout=4)"
    return {
        "redis": {
            "image": "stalwart/redis:dev",
            "command": [
                "--bind",
                "127.0.0.1",
                "--port",
                str(r),
                "--appendonly",
                "yes",
                "--dir",
                "/data",
            ],  # fmt: skip
            "healthcheck": {"test": ["CMD", "redis-cli", "-p", str(r), "ping"]},
        },
        "ignite": {
            "image": "stalwart/ignite:dev",
            "command": [str(i["10800"]), str(i["discovery"]), str(i["communication"])],
            "environment": {"STALWART_IGNITE_HEAP": "512m"},
            "healthcheck": {
                "test": ["CMD", "bash", "-c", f"exec 3<>/dev/tcp/127.0.0.1/{i['10800']}"]
            },
        },
        "prometheus": {
            "image": "stalwart/prometheus:dev",
            "command": [
                "--config.file=/etc/prometheus/prometheus.yml",
                "--storage.tsdb.path=/prometheus",
                f"--web.listen-address=127.0.0.1:{p}",
            ],
            "volumes": [
                f"{prometheus_yml}:/etc/prometheus/prometheus.yml:ro",
                "prometheus-data:/prometheus",
            ],  # fmt: skip
            "healthcheck": {"test": ["CMD", "python3", "-c", py_get.format(p)]},
        },
    }


def prometheus_config(ports: dict[str, dict[str, int]]) -> dict:
    targets = [
        {"targets": [f"127.0.0.1:{p[METRICS]}"], "labels": {"service": name}}
        for name, p in sorted(ports.items())
        if METRICS in p
    ]
    return {
        "global": {"scrape_interval": "5s", "evaluation_interval": "5s"},
        "scrape_configs": [{"job_name": "stalwart", "static_configs": targets}],
    }


def variant(compose: dict, base: int, prometheus_yml: Path) -> tuple[dict, dict]:
    services = {n: s for n, s in compose["services"].items() if n not in LEFT_OUT}
    ports = assign_ports(services, base)
    backends = backend_services(ports, prometheus_yml)
    out = {}
    for name, svc in services.items():
        svc = dict(svc)
        for key in ("networks", "ports", "build"):
            svc.pop(key, None)
        if name in backends:
            old_check = svc.get("healthcheck") or {}
            svc.update(backends[name])
            svc["healthcheck"] = {**old_check, "test": backends[name]["healthcheck"]["test"]}
        else:
            svc = stalwart_service(name, svc, ports)
        svc["network_mode"] = "host"
        out[name] = svc
    volumes = {k: v for k, v in (compose.get("volumes") or {}).items() if k != "grafana-data"}
    return {"services": out, "volumes": volumes}, ports


class _Plain(yaml.SafeDumper):
    """No &anchors: the variant is read by people comparing it with the real file."""

    def ignore_aliases(self, data) -> bool:
        return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--port-base", type=int, default=27100)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    prometheus_yml = (args.out / "prometheus.yml").resolve()
    doc, ports = variant(yaml.safe_load(COMPOSE.read_text()), args.port_base, prometheus_yml)
    (args.out / "docker-compose.yml").write_text(yaml.dump(doc, Dumper=_Plain, sort_keys=False))
    prometheus_yml.write_text(yaml.safe_dump(prometheus_config(ports), sort_keys=False))
    (args.out / "ports.json").write_text(json.dumps(ports, indent=2) + "\n")


if __name__ == "__main__":
    main()
