"""Server reflection that answers for every symbol, methods included.

grpcio-reflection looks symbols up with ``DescriptorPool.FindFileContainingSymbol``;
the upb pool finds services, messages, fields and enums that way but not a
service's methods, so ``grpcurl describe pkg.Service.Method`` (and ghz, which
resolves the method it is told to call) got "Symbol not found". This pool
answers a method with the file of its service. The file comes back with its
transitive dependencies, as grpcio-reflection always sends them.
"""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf import descriptor_pool
from grpc_reflection.v1alpha import reflection

SERVICE_NAME = reflection.SERVICE_NAME


class SymbolPool:
    """A descriptor pool whose symbol lookup also finds ``service.method`` names."""

    def __init__(self, pool: descriptor_pool.DescriptorPool | None = None) -> None:
        self._pool = pool or descriptor_pool.Default()

    def FindFileContainingSymbol(self, symbol: str) -> Any:  # noqa: N802 (pool API name)
        try:
            return self._pool.FindFileContainingSymbol(symbol)
        except KeyError:
            service_name, _, method = symbol.rpartition(".")
            if not service_name:
                raise
            try:
                service = self._pool.FindServiceByName(service_name)
            except KeyError:
                raise KeyError(symbol) from None
            if method not in service.methods_by_name:
                raise KeyError(symbol) from None
            return service.file

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)


def enable(server: grpc.aio.Server, service_names: list[str]) -> None:
    """Serve reflection for ``service_names`` (and for reflection itself) on ``server``."""
    reflection.enable_server_reflection([*service_names, SERVICE_NAME], server, pool=SymbolPool())
