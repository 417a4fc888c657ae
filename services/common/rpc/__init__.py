"""gRPC kit shared by every service: one server builder, one client-channel factory, bearer-token auth,
INVALID_ARGUMENT for undecodable requests and for strings or lists over their bounds (`bounds`)."""

from services.common.rpc.client import create_channel, default_service_config
from services.common.rpc.server import (
    BindError,
    PortInUseError,
    ServerHandle,
    serve_until_signal,
    start_server,
)

__all__ = [
    "BindError",
    "PortInUseError",
    "ServerHandle",
    "create_channel",
    "default_service_config",
    "serve_until_signal",
    "start_server",
]
