"""deploy/k8s: manifests parse and hang together (offline; no kubeconform here).

Checked: apiVersion/kind/metadata, kustomization lists every file, selectors
match pod labels, Services select pods and target declared ports, probes use
declared ports, RBAC covers the lease, GPUs are requested, STALWART_* variables
are settings the service reads, referenced ConfigMaps/Secrets are known.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.deploy.project import (
    DEPLOY,
    PENDING_ENV,
    load_yaml_docs,
    parse_dockerfile,
    settings_env,
    unknown_env,
)

K8S = DEPLOY / "k8s"
KNOWN_KINDS = {
    "Namespace": "v1",
    "ConfigMap": "v1",
    "Service": "v1",
    "ServiceAccount": "v1",
    "Deployment": "apps/v1",
    "StatefulSet": "apps/v1",
    "Role": "rbac.authorization.k8s.io/v1",
    "RoleBinding": "rbac.authorization.k8s.io/v1",
    "NetworkPolicy": "networking.k8s.io/v1",
}
WORKLOADS = ("Deployment", "StatefulSet")
#: Secrets the user creates (docs/deploy.md); never committed.
EXTERNAL_SECRETS = {"stalwart-tokens": {"admin", "node", "viewer"}}


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    out = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            out += load_yaml_docs(path)
    return out


def _of(docs: list[dict], *kinds: str) -> Iterator[dict]:
    return (d for d in docs if d["kind"] in kinds)


def _containers(workload: dict) -> list[dict]:
    return workload["spec"]["template"]["spec"]["containers"]


def _app(workload: dict) -> str:
    return workload["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"]


def test_every_object_is_well_formed(docs: list[dict]) -> None:
    for d in docs:
        assert KNOWN_KINDS.get(d["kind"]) == d["apiVersion"], (d["kind"], d["apiVersion"])
        assert d["metadata"]["name"]
        if d["kind"] != "Namespace":
            assert d["metadata"]["namespace"] == "stalwart", d["metadata"]["name"]
    names = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert len(names) == len(set(names)), "duplicate objects"


def test_kustomization_lists_every_file() -> None:
    kust = load_yaml_docs(K8S / "kustomization.yaml")[0]
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kust["resources"]) == files


def test_selectors_match_pod_labels(docs: list[dict]) -> None:
    for w in _of(docs, *WORKLOADS):
        labels = w["spec"]["template"]["metadata"]["labels"]
        selector = w["spec"]["selector"]["matchLabels"]
        assert selector.items() <= labels.items(), w["metadata"]["name"]


def test_services_select_pods_and_ports(docs: list[dict]) -> None:
    workloads = list(_of(docs, *WORKLOADS))
    for svc in _of(docs, "Service"):
        selected = [
            w for w in workloads
            if svc["spec"]["selector"].items() <= w["spec"]["template"]["metadata"]["labels"].items()
        ]  # fmt: skip
        assert selected, f"Service {svc['metadata']['name']} selects no pods"
        for w in selected:
            ports = {p.get("name") for c in _containers(w) for p in c["ports"]}
            numbers = {p["containerPort"] for c in _containers(w) for p in c["ports"]}
            for port in svc["spec"]["ports"]:
                target = port.get("targetPort", port["port"])
                assert target in ports or target in numbers, (svc["metadata"]["name"], target)


def test_statefulsets_have_headless_services(docs: list[dict]) -> None:
    services = {s["metadata"]["name"]: s for s in _of(docs, "Service")}
    for sts in _of(docs, "StatefulSet"):
        svc = services.get(sts["spec"]["serviceName"])
        assert svc is not None and svc["spec"].get("clusterIP") == "None", sts["metadata"]["name"]


def test_containers_have_ports_probes_resources(docs: list[dict]) -> None:
    for w in _of(docs, *WORKLOADS):
        for c in _containers(w):
            names = {p["name"] for p in c["ports"]}
            numbers = {p["containerPort"] for p in c["ports"]}
            assert c.get("image") and ":" in c["image"], c["name"]
            assert c.get("resources", {}).get("requests"), c["name"]
            for probe_kind in ("readinessProbe", "livenessProbe"):
                probe = c.get(probe_kind)
                assert probe, f"{c['name']}: no {probe_kind}"
                handler = probe.get("grpc") or probe.get("tcpSocket") or probe.get("httpGet")
                assert handler and (handler["port"] in names or handler["port"] in numbers)


def test_stalwart_pods_run_as_non_root(docs: list[dict]) -> None:
    for w in _of(docs, *WORKLOADS):
        if _app(w) == "ignite":
            continue  # the official image's own user
        ctx = w["spec"]["template"]["spec"]["securityContext"]
        assert ctx["runAsNonRoot"] is True and ctx["runAsUser"] == 10001


def test_stalwart_images_are_dockerfile_targets(docs: list[dict]) -> None:
    """stalwart/<name> images are built by `--target <name>`; pods run as its USER."""
    dockerfile = parse_dockerfile()
    for w in _of(docs, *WORKLOADS):
        for c in _containers(w):
            repo = c["image"].split(":")[0]
            if not repo.startswith("stalwart/"):
                continue
            target = repo.removeprefix("stalwart/")
            assert target in dockerfile.stages, f"{c['name']}: no target for {c['image']}"
            assert target == _app(w), f"{c['name']}: runs {c['image']} in app {_app(w)}"
            user = int(dockerfile.last(target, "USER"))
            ctx = w["spec"]["template"]["spec"]["securityContext"]
            assert ctx["runAsUser"] == user, f"{c['name']}: runAsUser vs the image's USER {user}"
            env = dockerfile.pairs(target, "ENV")
            ports = {str(p["containerPort"]) for p in c["ports"]}
            assert {env["STALWART_PORT"], env["STALWART_METRICS_PORT"]} <= ports, c["name"]


def test_topology(docs: list[dict]) -> None:
    by_app: dict[str, list[dict]] = {}
    for w in _of(docs, *WORKLOADS):
        by_app.setdefault(_app(w), []).append(w)
    (coord,) = by_app["coordinator"]
    assert coord["kind"] == "Deployment" and coord["spec"]["replicas"] == 2
    assert all(
        w["kind"] == "StatefulSet" and w["spec"]["replicas"] >= 2 for w in by_app["paramserver"]
    )
    assert by_app["ignite"][0]["kind"] == "StatefulSet"
    for w in by_app["trainer"]:
        assert w["kind"] == "Deployment"
        for c in _containers(w):
            assert int(c["resources"]["limits"]["nvidia.com/gpu"]) >= 1


def test_coordinator_may_hold_the_lease(docs: list[dict]) -> None:
    (coord,) = (w for w in _of(docs, "Deployment") if _app(w) == "coordinator")
    account = coord["spec"]["template"]["spec"]["serviceAccountName"]
    assert any(sa["metadata"]["name"] == account for sa in _of(docs, "ServiceAccount"))
    roles = {r["metadata"]["name"]: r for r in _of(docs, "Role")}
    granted: set[str] = set()
    for rb in _of(docs, "RoleBinding"):
        if any(s["kind"] == "ServiceAccount" and s["name"] == account for s in rb["subjects"]):
            for rule in roles[rb["roleRef"]["name"]]["rules"]:
                if "coordination.k8s.io" in rule["apiGroups"] and "leases" in rule["resources"]:
                    granted |= set(rule["verbs"])
    assert {"get", "create", "update"} <= granted
    env = {e["name"]: e.get("value") for e in _containers(coord)[0]["env"]}
    assert env["STALWART_LEASE_URL"].startswith("k8s://stalwart/")


def test_env_matches_settings_and_refs_exist(docs: list[dict]) -> None:
    configmaps = {c["metadata"]["name"]: c["data"] for c in _of(docs, "ConfigMap")}
    # Shared variables reach every pod; each must be read by some service.
    known_anywhere = set().union(*(PENDING_ENV.values()))
    for service in ("paramserver", "coordinator", "trainer", "health"):
        known_anywhere |= settings_env(service) or set()
    for w in _of(docs, *WORKLOADS):
        for c in _containers(w):
            for src in c.get("envFrom", []):
                data = configmaps[src["configMapRef"]["name"]]
                stray = {k for k in data if k.startswith("STALWART_")} - known_anywhere
                assert not stray, f"no service reads {sorted(stray)}"
            names = set()
            for e in c.get("env", []):
                names.add(e["name"])
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["key"] in EXTERNAL_SECRETS[ref["name"]], ref
            if _app(w) == "ignite":
                continue
            unknown = unknown_env(_app(w), names)
            assert not unknown, f"{_app(w)} has no settings for {sorted(unknown or [])}"


#: The gRPC service each role reports ready only while it may take client calls.
READY_SERVICE = {
    "coordinator": "stalwart.v1.CoordinatorService",  # the leader only
    "paramserver": "stalwart.v1.ParamServerService",  # the primary only
}


def test_readiness_is_the_services_own_name_and_liveness_the_process(docs: list[dict]) -> None:
    for w in _of(docs, *WORKLOADS):
        want = READY_SERVICE.get(_app(w))
        if want is None:
            continue
        (c,) = _containers(w)
        assert c["readinessProbe"]["grpc"].get("service") == want, c["name"]
        liveness = c["livenessProbe"].get("grpc") or c["livenessProbe"].get("tcpSocket")
        assert not liveness.get("service"), f"{c['name']}: a standby must stay alive"


def test_paramserver_backups_stay_resolvable_while_not_ready(docs: list[dict]) -> None:
    """The primary replicates to backups by name; a backup is never ready."""
    for svc in _of(docs, "Service"):
        if svc["spec"]["selector"].get("app.kubernetes.io/name") == "paramserver":
            assert svc["spec"].get("publishNotReadyAddresses") is True, svc["metadata"]["name"]


def test_trainers_and_coordinators_are_told_where_the_health_service_is(
    docs: list[dict],
) -> None:
    (svc,) = (s for s in _of(docs, "Service") if s["metadata"]["name"] == "health")
    ports = {p["port"] for p in svc["spec"]["ports"]}
    for w in _of(docs, *WORKLOADS):
        if _app(w) not in ("trainer", "coordinator"):
            continue
        (c,) = _containers(w)
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        host, port = env["STALWART_HEALTH"].split(":")
        assert host.split(".")[0] == "health" and int(port) in ports, w["metadata"]["name"]
