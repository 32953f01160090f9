"""Settings every Stalwart service shares, from flags, ``STALWART_*`` env vars and defaults.

Precedence is flag, then environment variable, then default. pydantic-settings
builds the argparse parser from the model fields (``--port``, ``--ready-file``,
``--insecure/--no-insecure`` ...), so a service that subclasses
:class:`ServiceSettings` and adds fields gets their flags and env vars for free::

    class ParamServerSettings(ServiceSettings):
        store_url: str = "shm:///dev/shm/stalwart"
        \"\"\"Where checkpoints go.\"\"\"

    settings = ParamServerSettings.from_args(sys.argv[1:])   # --store-url, STALWART_STORE_URL
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, Self

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

MIB = 1024 * 1024


def _default_node_id() -> str:
    # Host name keeps logs readable; the random tail keeps two processes on one
    # host apart.
    return f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}"


class ServiceSettings(BaseSettings):
    """Configuration of one service process. Immutable once built."""

    model_config = SettingsConfigDict(
        env_prefix="STALWART_",
        frozen=True,
        extra="forbid",
        use_attribute_docstrings=True,  # field docstrings become --help text
        cli_kebab_case=True,
        cli_implicit_flags=True,
        cli_avoid_json=True,
    )

    host: str = "127.0.0.1"
    """Address the gRPC server binds. Non-loopback needs TLS material or --insecure."""

    port: int = Field(default=0, ge=0, le=65535)
    """gRPC port; 0 picks a free one (read it from the ready file)."""

    metrics_port: int = Field(default=0, ge=-1, le=65535)
    """Prometheus /metrics HTTP port; 0 picks a free one, -1 turns the endpoint off."""

    node_id: str = Field(default_factory=_default_node_id, min_length=1, max_length=128)
    """Name of this process in logs, metrics and the coordinator's membership."""

    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """Lowest level written to the JSON log on stderr."""

    insecure: bool = False
    """Allow plaintext on a non-loopback host (only inside a private network)."""

    tls_cert: Path | None = None
    """PEM certificate chain of this process; with tls_key it turns TLS on."""

    tls_key: Path | None = None
    """PEM private key matching tls_cert."""

    tls_ca: Path | None = None
    """PEM CA bundle; when set, peers must present a certificate it signed (mTLS)."""

    admin_token: SecretStr = SecretStr("")
    """Bearer token of the admin role. All three empty: authentication is off."""

    node_token: SecretStr = SecretStr("")
    """Bearer token of the node role (trainers, paramservers, agents)."""

    viewer_token: SecretStr = SecretStr("")
    """Bearer token of the read-only viewer role."""

    max_message_bytes: int = Field(default=8 * MIB, ge=64 * 1024)
    """Largest gRPC message sent or received; bigger ones fail RESOURCE_EXHAUSTED."""

    chunk_bytes: int = Field(default=4 * MIB, ge=4 * 1024)
    """Tensor bytes per chunk on streaming RPCs; must leave room under max_message_bytes.
    At least 4 KiB, the smallest chunk a paramserver serves a Pull in."""

    ready_file: Path | None = None
    """When set, a JSON file (address, metrics_port, pid, node_id) written once serving."""

    grace_seconds: float = Field(default=10.0, ge=0.0)
    """On SIGTERM: time for the shutdown hook and in-flight RPCs before they are cut."""

    @model_validator(mode="after")
    def _check_consistency(self) -> Self:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key must be given together")
        if self.tls_ca is not None and self.tls_cert is None:
            raise ValueError("tls_ca (mTLS) needs tls_cert and tls_key as well")
        # A chunk travels inside one message with a small header around it.
        if self.chunk_bytes + 64 * 1024 > self.max_message_bytes:
            raise ValueError("chunk_bytes must be at least 64 KiB below max_message_bytes")
        return self

    @classmethod
    def from_args(cls, argv: Sequence[str] | None = None, *, prog: str | None = None) -> Self:
        """Build settings from command-line flags (``sys.argv[1:]`` when None), env and defaults.

        Unknown flags print usage and exit with status 2, as argparse does; values
        that fail validation raise :class:`pydantic.ValidationError`.
        """
        args = list(argv) if argv is not None else True
        return cls(_cli_parse_args=args, _cli_prog_name=prog)

    @property
    def tls_enabled(self) -> bool:
        return self.tls_cert is not None

    @property
    def mtls_enabled(self) -> bool:
        return self.tls_ca is not None

    @property
    def auth_enabled(self) -> bool:
        return any(t.get_secret_value() for t in self.role_tokens().values())

    def role_tokens(self) -> dict[str, SecretStr]:
        """Configured tokens by role name (``admin``, ``node``, ``viewer``)."""
        return {"admin": self.admin_token, "node": self.node_token, "viewer": self.viewer_token}
