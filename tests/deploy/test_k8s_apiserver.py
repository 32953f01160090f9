"""deploy/k8s against a real kube-apiserver (etcd behind it, no kubelet).

Every object of the base and of each overlay passes a server-side dry run; applying
twice changes nothing; the coordinator's service account may do what leader election
needs and nothing more; two coordinator processes on this machine elect their leader
through the Lease API with the service account's token and the lease settings of the
manifest, take over after kill -9 and after SIGSTOP, and a resumed old leader is refused.

Needs kube-apiserver built (``make k8s-apiserver``; ``make k8s-test`` builds it and runs
this file), etcd and kubectl; skipped with a one-line reason otherwise, failed under
STALWART_REQUIRE_BACKENDS=1.
"""

from __future__ import annotations

import asyncio
import copy
import importlib.util
import math
import os
import secrets
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from stalwart.api import coordinator
from stalwart.client import CoordinatorClient
from stalwart.errors import ErrorKind, RpcError
from stalwart.procs import ServiceProcess, start_service
from tests.backends import REPO, BackendUnavailable, skip_or_fail
from tests.deploy.kube import (
    BASE,
    COMPONENTS,
    DEPLOY,
    NAMESPACE,
    OVERLAYS,
    Kubectl,
    object_names,
    render,
    start_apiserver,
    stop_apiserver,
    token_kubeconfig,
)
from tests.helpers import PRELOAD, assert_eventually_async
from tests.integration.coordinator.support import call, job_spec, status_of, wait_leader

pytestmark = pytest.mark.timeout(600)

COORDINATOR_SA = "stalwart-coordinator"
IGNITE_SA = "stalwart-ignite"


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubectl]:
    """The admin's kubectl on a fresh API server, prepared the way docs/deploy.md says:
    the namespace first, then the token Secret, then ``kubectl apply -k``."""
    directory = tmp_path_factory.mktemp("k8s")
    try:
        kubeconfig = start_apiserver(directory)
    except BackendUnavailable as e:
        reason = f"no Kubernetes API server: {e}"
    else:
        reason = ""
    if reason:
        skip_or_fail(reason)
        return
    admin = Kubectl(kubeconfig)
    try:
        admin.run("create", "namespace", NAMESPACE)
        tokens = [
            f"--from-literal={k}={secrets.token_hex(32)}" for k in ("admin", "node", "viewer")
        ]
        admin.run("-n", NAMESPACE, "create", "secret", "generic", "stalwart-tokens", *tokens)
        yield admin
    finally:
        stop_apiserver(directory)


def _rel(path: Path) -> str:
    return str(path.relative_to(DEPLOY))


# ------------------------------------------------------------------ manifests


def test_every_component_is_used_by_an_overlay() -> None:
    used = set()
    for overlay in OVERLAYS:
        kust = yaml.safe_load((overlay / "kustomization.yaml").read_text())
        used |= {(overlay / c).resolve() for c in kust.get("components", [])}
    assert OVERLAYS and {c.resolve() for c in COMPONENTS} <= used


@pytest.mark.parametrize("directory", [BASE, *OVERLAYS], ids=_rel)
def test_server_side_dry_run_accepts_every_object(kube: Kubectl, directory: Path) -> None:
    proc = kube.run("apply", "--dry-run=server", "--validate=strict", "-k", str(directory),
                    "-o", "name")  # fmt: skip
    assert sorted(proc.stdout.split()) == sorted(object_names(render(directory)))


def _break_port(docs: list[dict]) -> None:
    _coordinator(docs)["ports"][0]["containerPort"] = 70000


def _misspell_a_field(docs: list[dict]) -> None:
    _coordinator(docs)["imagePullPolcy"] = "Always"


def _coordinator(docs: list[dict]) -> dict:
    """The coordinator Deployment's container."""
    (deploy,) = (
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "coordinator"
    )
    return deploy["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize(
    ("breakage", "complaint"),
    [(_break_port, "containerPort"), (_misspell_a_field, 'unknown field "spec.template.spec.containers[0].imagePullPolcy"')],
    ids=["port-out-of-range", "misspelt-field"],
)  # fmt: skip
def test_the_dry_run_catches_what_kustomize_lets_through(
    kube: Kubectl, breakage: Callable[[list[dict]], None], complaint: str
) -> None:
    """The dry run is a real check: a bad value or a misspelt field renders fine offline
    and is refused by the server, with nothing stored."""
    docs = copy.deepcopy(render(BASE))
    breakage(docs)
    proc = kube.run("apply", "--dry-run=server", "--validate=strict", "-f", "-",
                    stdin=yaml.safe_dump_all(docs), check=False)  # fmt: skip
    assert proc.returncode != 0 and complaint in proc.stderr, proc.stderr
    assert kube.run("get", "deployment", "-n", NAMESPACE, "-o", "name").stdout == ""


def _versions(kube: Kubectl) -> dict[str, str]:
    """resourceVersion of every object of the base, as stored."""
    items = kube.json("get", "-k", str(BASE))["items"]
    return {f"{d['kind']}/{d['metadata']['name']}": d["metadata"]["resourceVersion"] for d in items}


def test_apply_then_apply_again_changes_nothing(kube: Kubectl) -> None:
    """A second apply writes nothing: no resourceVersion moves and kubectl diff is empty.
    (kubectl still prints "configured" for the StatefulSets and the NetworkPolicy: its
    client-side patch for them is not empty, but the server finds nothing to change.)"""
    objects = render(BASE)
    first = kube.run("apply", "-k", str(BASE)).stdout.splitlines()
    assert len(first) == len(objects), first
    before = _versions(kube)
    assert len(before) == len(objects)
    again = kube.run("apply", "-k", str(BASE)).stdout.splitlines()
    assert len(again) == len(objects)
    assert _versions(kube) == before
    unchanged = {ln.split()[0] for ln in again if ln.endswith(" unchanged")}
    assert {"deployment.apps/coordinator", "deployment.apps/trainer", "configmap/stalwart-config",
            "role.rbac.authorization.k8s.io/stalwart-leader-election"} <= unchanged  # fmt: skip
    diff = kube.run("diff", "-k", str(BASE), check=False)
    assert (diff.returncode, diff.stdout) == (0, ""), diff.stdout + diff.stderr
    stored = kube.run("get", "deployment,statefulset,service", "-n", NAMESPACE, "-o", "name")
    want = {n for n in object_names(objects) if n.split("/")[0] in
            ("deployment.apps", "statefulset.apps", "service")}  # fmt: skip
    assert set(stored.stdout.split()) == want


# ------------------------------------------------------------------ RBAC


@pytest.fixture(scope="module")
def applied(kube: Kubectl) -> Kubectl:
    """The base applied (again: applying is idempotent, and a test run alone needs it)."""
    kube.run("apply", "-k", str(BASE))
    return kube


@pytest.mark.parametrize(
    ("account", "verb", "resource", "namespace", "allowed"),
    [
        # leader election: read, create and renew the Lease
        (COORDINATOR_SA, "get", "leases.coordination.k8s.io", NAMESPACE, True),
        (COORDINATOR_SA, "create", "leases.coordination.k8s.io", NAMESPACE, True),
        (COORDINATOR_SA, "update", "leases.coordination.k8s.io", NAMESPACE, True),
        # and nothing else
        (COORDINATOR_SA, "delete", "leases.coordination.k8s.io", NAMESPACE, False),
        (COORDINATOR_SA, "update", "leases.coordination.k8s.io", "default", False),
        (COORDINATOR_SA, "get", "secrets", NAMESPACE, False),
        (COORDINATOR_SA, "list", "pods", NAMESPACE, False),
        (COORDINATOR_SA, "create", "pods", NAMESPACE, False),
        (COORDINATOR_SA, "patch", "deployments.apps", NAMESPACE, False),
        # Ignite discovery reads endpoints and pods, no more
        (IGNITE_SA, "list", "endpoints", NAMESPACE, True),
        (IGNITE_SA, "watch", "pods", NAMESPACE, True),
        (IGNITE_SA, "update", "endpoints", NAMESPACE, False),
        (IGNITE_SA, "get", "leases.coordination.k8s.io", NAMESPACE, False),
        (IGNITE_SA, "get", "secrets", NAMESPACE, False),
    ],
)
def test_service_account_permissions(
    applied: Kubectl, account: str, verb: str, resource: str, namespace: str, allowed: bool
) -> None:
    assert applied.can_i(account, verb, resource, namespace) is allowed


# --------------------------------------------------------- coordinators


FAST = ("--grace-seconds", "1", "--metrics-port", "-1", "--log-level", "info")


class Coordinators:
    """Coordinator processes on this machine holding their lease in the API server as the
    coordinator's service account; every one is stopped (even if SIGSTOPped) at the end."""

    def __init__(self, run_dir: Path, store_url: str, env: dict[str, str]) -> None:
        # A store of their own and no store prefix: the prefix would enter the Lease's
        # name, and the first test checks the name the manifest's coordinators use.
        self.run_dir, self.store_url, self.env = run_dir, store_url, env
        self.prefix = "t" + uuid.uuid4().hex[:8]
        self.procs: list[ServiceProcess] = []

    def start(self, name: str, lease_url: str) -> ServiceProcess:
        args = [*FAST, "--store-url", self.store_url, "--node-id", name]
        proc = start_service("services.coordinator", args, self.run_dir, f"{self.prefix}-{name}",
                             env={**self.env, "STALWART_LEASE_URL": lease_url}, cwd=REPO,
                             timeout=90, preload=PRELOAD)  # fmt: skip
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.alive():
                os.killpg(proc.pid, signal.SIGCONT)  # a stopped process cannot handle SIGTERM
                proc.terminate(timeout=10)


def _manifest_env() -> dict[str, str]:
    """The coordinator container's literal env in the rendered base."""
    return {e["name"]: e["value"] for e in _coordinator(render(BASE))["env"] if "value" in e}


@pytest.fixture(scope="module")
def coordinator_env(applied: Kubectl, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The manifest's leader-lease settings and a kubeconfig with the service account's token."""
    if importlib.util.find_spec("kubernetes") is None:
        skip_or_fail("the kubernetes package is not installed (pip install -e '.[k8s]')")
    env = {k: v for k, v in _manifest_env().items() if k.startswith("STALWART_LEADER_")}
    path = tmp_path_factory.mktemp("coordinator-sa") / "kubeconfig"
    env["KUBECONFIG"] = str(token_kubeconfig(applied, COORDINATOR_SA, path))
    return env


@pytest.fixture
def coordinators(run_dir: Path, coordinator_env: dict[str, str]) -> Iterator[Coordinators]:
    parent = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    store = tempfile.mkdtemp(prefix="stalwart-k8s-test-", dir=parent)
    c = Coordinators(run_dir, f"shm://{store}", coordinator_env)
    try:
        yield c
    finally:
        c.stop_all()
        shutil.rmtree(store, ignore_errors=True)


def _lease(kube: Kubectl, lease_url: str) -> dict:
    prefix = lease_url.rpartition("/")[2]
    return kube.json("get", "lease", f"{prefix}-coordinator-leader", "-n", NAMESPACE)


def _token(lease: dict) -> int:
    return int(lease["metadata"]["annotations"]["stalwart.dev/fencing-token"])


async def _leader_and_standby(coordinators: Coordinators, lease_url: str):
    first = coordinators.start("c1", lease_url)
    status = await wait_leader(first.address, timeout=60)
    second = coordinators.start("c2", lease_url)

    async def follows():
        assert (await status_of(second.address)).leader_address == first.address

    await assert_eventually_async(follows, timeout=60)
    return first, second, status


def test_one_coordinator_leads_and_the_lease_object_names_it(
    applied: Kubectl, coordinators: Coordinators
) -> None:
    lease_url = _manifest_env()["STALWART_LEASE_URL"]  # the manifest's own Lease
    first, second, status = asyncio.run(_leader_and_standby(coordinators, lease_url))
    lease = _lease(applied, lease_url)
    assert lease["metadata"]["name"] == "stalwart-coordinator-leader"
    assert lease["spec"]["holderIdentity"] == f"c1@{first.address}"
    assert _token(lease) == status.epoch
    ttl = float(coordinators.env["STALWART_LEADER_TTL_SECONDS"])
    assert lease["spec"]["leaseDurationSeconds"] == math.ceil(ttl)
    standby = asyncio.run(status_of(second.address))
    assert not standby.is_leader and standby.epoch == status.epoch


def test_kill_9_the_leader_and_the_standby_takes_over(
    applied: Kubectl, coordinators: Coordinators
) -> None:
    lease_url = f"k8s://{NAMESPACE}/{coordinators.prefix}"

    async def scenario() -> tuple[float, int]:
        first, second, status = await _leader_and_standby(coordinators, lease_url)
        started = time.monotonic()
        first.kill()
        new = await wait_leader(second.address, timeout=60)
        took = time.monotonic() - started
        assert new.epoch > status.epoch
        return took, new.epoch

    took, epoch = asyncio.run(scenario())
    ttl = coordinators.env["STALWART_LEADER_TTL_SECONDS"]
    print(f"\nk8s:// lease, takeover after kill -9 of the leader (ttl {ttl}s): {took:.2f}s")
    lease = _lease(applied, lease_url)
    assert lease["spec"]["holderIdentity"] == f"c2@{coordinators.procs[1].address}"
    assert lease["spec"]["leaseTransitions"] >= 1 and _token(lease) == epoch


def test_a_frozen_leader_is_replaced_and_refused_when_it_wakes(
    applied: Kubectl, coordinators: Coordinators
) -> None:
    lease_url = f"k8s://{NAMESPACE}/{coordinators.prefix}"

    async def scenario() -> float:
        leader, standby, old = await _leader_and_standby(coordinators, lease_url)
        os.killpg(leader.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            new = await wait_leader(standby.address, timeout=60)
            took = time.monotonic() - started
            # A request queued at the frozen leader runs when it wakes: it must be refused.
            pending = asyncio.create_task(
                call(leader.address, "CreateJob",
                     coordinator.CreateJobRequest(job_id="from-the-past", spec=job_spec()),
                     timeout=30)
            )  # fmt: skip
            await asyncio.sleep(0.3)  # lets the request reach the frozen process
        finally:
            os.killpg(leader.pid, signal.SIGCONT)
        with pytest.raises(RpcError) as info:
            await pending
        assert info.value.kind is ErrorKind.NOT_LEADER
        assert new.epoch > old.epoch

        async def woke_as_standby():
            woke = await status_of(leader.address)
            assert not woke.is_leader and woke.leader_address == standby.address
            assert woke.epoch == new.epoch

        await assert_eventually_async(woke_as_standby, timeout=60)
        with pytest.raises(RpcError) as again:  # and every later command too
            await call(leader.address, "ListJobs", coordinator.ListJobsRequest())
        assert again.value.kind is ErrorKind.NOT_LEADER
        async with CoordinatorClient([standby.address]) as client:
            assert "from-the-past" not in [j.job_id for j in await client.all_jobs()]
        return took

    took = asyncio.run(scenario())
    print(f"\nk8s:// lease, takeover after SIGSTOP of the leader: {took:.2f}s")
    lease = _lease(applied, lease_url)
    assert lease["spec"]["holderIdentity"] == f"c2@{coordinators.procs[1].address}"
