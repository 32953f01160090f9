"""Client SDK: the public way to talk to Stalwart services from Python."""

from stalwart.client.paramserver import ParamServerClient, ShardGroupClient

__all__ = ["ParamServerClient", "ShardGroupClient"]
