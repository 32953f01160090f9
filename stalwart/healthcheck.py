"""``python -m stalwart.healthcheck [host:port] [--service NAME]``: one grpc.health.v1 probe.

Exit 0 when the server answers SERVING, 1 otherwise (NOT_SERVING, unreachable,
timeout). Container HEALTHCHECKs and compose healthchecks run it inside the
service's own container, so the default target is the loopback gRPC port; TLS
material comes from the same ``STALWART_TLS_*`` variables the service reads.
The health service is exempt from token checks (stalwart.auth), so no token.
"""

from __future__ import annotations

import argparse
import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def _credentials() -> grpc.ChannelCredentials | None:
    ca = os.environ.get("STALWART_TLS_CA")
    if not ca:
        return None  # plaintext: what the service serves without certificates
    cert, key = os.environ.get("STALWART_TLS_CERT"), os.environ.get("STALWART_TLS_KEY")
    with open(ca, "rb") as f:
        root = f.read()
    chain = private = None
    if cert and key:  # the server may require a client certificate (mTLS)
        with open(cert, "rb") as f:
            chain = f.read()
        with open(key, "rb") as f:
            private = f.read()
    return grpc.ssl_channel_credentials(root, private, chain)


def probe(target: str, service: str = "", timeout_s: float = 3.0) -> str:
    """The health status name (``SERVING`` ...) or a one-line reason it is unknown."""
    creds = _credentials()
    channel = grpc.secure_channel(target, creds) if creds else grpc.insecure_channel(target)
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError as err:
            return f"{err.code().name}: {err.details()}"
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def main(argv: list[str] | None = None) -> int:
    default = f"127.0.0.1:{os.environ.get('STALWART_PORT', '50051')}"
    parser = argparse.ArgumentParser(prog="python -m stalwart.healthcheck")
    parser.add_argument("target", nargs="?", default=default, help=f"host:port (default {default})")
    parser.add_argument("--service", default="", help="service name; empty means the whole server")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds")
    args = parser.parse_args(argv)
    status = probe(args.target, args.service, args.timeout)
    print(status)
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main())
