"""A real Kubernetes API server for tests: started by ``scripts/backends/k8s.sh``,
driven with the machine's ``kubectl``.

No kubelet runs: objects are validated (schemas, admission, RBAC) and stored, no pod
starts. The binary comes from ``scripts/k8s/build-apiserver``'s cache (``make
k8s-apiserver``); without it the tests that need it skip with a one-line reason, or fail
with it under ``STALWART_REQUIRE_BACKENDS=1``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.backends import REPO, BackendUnavailable, _script

DEPLOY = REPO / "deploy"
BASE = DEPLOY / "k8s"
OVERLAYS = sorted(p.parent for p in (DEPLOY / "k8s-overlays").glob("*/kustomization.yaml"))
COMPONENTS = sorted(p.parent for p in (DEPLOY / "k8s-components").glob("*/kustomization.yaml"))
NAMESPACE = "stalwart"


def start_apiserver(directory: Path) -> Path:
    """etcd + kube-apiserver on loopback; returns the admin kubeconfig."""
    return Path(_script("k8s.sh", "start", str(directory), timeout=600).splitlines()[-1])


def stop_apiserver(directory: Path) -> None:
    _script("k8s.sh", "stop", str(directory), timeout=120)


class Kubectl:
    """``kubectl`` with one kubeconfig; results as CompletedProcess or parsed JSON."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig

    def run(
        self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 180
    ) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        proc = subprocess.run(
            ["kubectl", *args], input=stdin, capture_output=True, text=True,
            timeout=timeout, env=env, check=False,
        )  # fmt: skip
        if check and proc.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} exited {proc.returncode}: {proc.stderr}"
            )
        return proc

    def json(self, *args: str) -> dict[str, Any]:
        return json.loads(self.run(*args, "-o", "json").stdout)

    def can_i(self, account: str, verb: str, resource: str, namespace: str = NAMESPACE) -> bool:
        """Whether service account ``account`` of ``namespace`` may, as the server decides."""
        who = f"system:serviceaccount:{NAMESPACE}:{account}"
        proc = self.run("auth", "can-i", verb, resource, "-n", namespace, "--as", who, check=False)
        answer = proc.stdout.strip()
        assert answer in ("yes", "no"), proc.stderr  # anything else is an error, not a "no"
        return answer == "yes"


def render(directory: Path) -> list[dict[str, Any]]:
    """The objects ``kubectl apply -k directory`` would send (kustomize, offline)."""
    out = subprocess.run(
        ["kubectl", "kustomize", str(directory)], capture_output=True, text=True,
        timeout=120, check=True,
    ).stdout  # fmt: skip
    return [d for d in yaml.safe_load_all(out) if d]


def object_names(docs: list[dict[str, Any]]) -> set[str]:
    """``kind/name`` the way ``kubectl ... -o name`` prints them (kind lower-case, with group)."""
    names = set()
    for d in docs:
        group = d["apiVersion"].rpartition("/")[0]
        kind = d["kind"].lower() + (f".{group}" if group else "")
        names.add(f"{kind}/{d['metadata']['name']}")
    return names


def token_kubeconfig(admin: Kubectl, account: str, path: Path) -> Path:
    """A kubeconfig that authenticates as service account ``account`` with a bound token
    from the TokenRequest API, the way a pod's mounted token would."""
    token = admin.run("create", "token", account, "-n", NAMESPACE, "--duration", "2h").stdout
    config = yaml.safe_load(admin.kubeconfig.read_text())
    config["users"] = [{"name": account, "user": {"token": token.strip()}}]
    for context in config["contexts"]:
        context["context"]["user"] = account
    path.write_text(yaml.safe_dump(config))
    return path


__all__ = ["BackendUnavailable", "Kubectl", "render", "start_apiserver", "stop_apiserver"]
