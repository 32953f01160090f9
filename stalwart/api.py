"""The one door to the generated protobuf and gRPC code.

Everything else in the project imports messages and stubs from here, never from
``stalwart.v1`` directly, so the generated layout can change in one place.
Run ``make proto`` to (re)generate ``stalwart/v1/``.
"""

try:
    from stalwart.v1 import common_pb2 as common
    from stalwart.v1 import coordinator_pb2 as coordinator
    from stalwart.v1 import coordinator_pb2_grpc as coordinator_grpc
    from stalwart.v1 import health_pb2 as health
    from stalwart.v1 import health_pb2_grpc as health_grpc
    from stalwart.v1 import paramserver_pb2 as paramserver
    from stalwart.v1 import paramserver_pb2_grpc as paramserver_grpc
    from stalwart.v1 import trainer_pb2 as trainer
    from stalwart.v1 import trainer_pb2_grpc as trainer_grpc
except ImportError as exc:  # pragma: no cover - only before codegen
    raise ImportError(
        "generated protobuf code is missing: run `make proto` (or `make setup`)"
    ) from exc

SERVICE_NAMES = (
    "stalwart.v1.CoordinatorService",
    "stalwart.v1.ParamServerService",
    "stalwart.v1.TrainerService",
    "stalwart.v1.HealthMonitorService",
)

__all__ = [
    "common",
    "coordinator",
    "coordinator_grpc",
    "health",
    "health_grpc",
    "paramserver",
    "paramserver_grpc",
    "trainer",
    "trainer_grpc",
    "SERVICE_NAMES",
]
