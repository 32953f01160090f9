"""Each service's Dockerfile: what it copies exists, it builds protos, runs as
non-root, probes grpc.health.v1 and starts the service module it is named for."""

from __future__ import annotations

import re

import pytest

from tests.deploy.project import ROOT

SERVICES = ["paramserver", "coordinator", "trainer", "health"]


def _instructions(text: str) -> list[tuple[str, str]]:
    joined = re.sub(r"\\\n", " ", text)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


@pytest.mark.parametrize("service", SERVICES)
def test_dockerfile(service: str) -> None:
    text = (ROOT / "services" / service / "Dockerfile").read_text()
    steps = _instructions(text)
    kinds = [k for k, _ in steps]
    assert kinds.count("FROM") == 2, "a build stage and a slim runtime stage"
    for kind, rest in steps:
        if kind == "COPY" and not rest.startswith("--from"):
            *sources, _dest = rest.split()
            for src in sources:
                if "*" not in src:
                    assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
    assert "grpc_tools.protoc" in text and "protos/stalwart/v1/*.proto" in text
    user = [rest for kind, rest in steps if kind == "USER"]
    assert user and user[-1] not in ("root", "0"), "must run as a non-root user"
    assert 'CMD ["python", "-m", "stalwart.healthcheck"]' in text
    assert (ROOT / "stalwart" / "healthcheck.py").is_file()
    entry = [rest for kind, rest in steps if kind == "ENTRYPOINT"]
    assert entry == [f'["python", "-m", "services.{service}"]']
    assert "download.pytorch.org/whl/cpu" in text, "CPU torch wheels by default"


def test_trainer_takes_a_cuda_base() -> None:
    text = (ROOT / "services" / "trainer" / "Dockerfile").read_text()
    assert re.search(r"^ARG BASE_IMAGE=", text, re.M)
    assert text.count("FROM ${BASE_IMAGE}") == 2
    assert "ARG TORCH_INDEX_URL=" in text


def test_dockerignore_keeps_generated_and_local_state_out() -> None:
    lines = set((ROOT / ".dockerignore").read_text().split())
    assert {".git", ".venv", "stalwart/v1", "runs"} <= lines
