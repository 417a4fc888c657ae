"""gRPC kit shared by every service: one server builder, one client-channel factory, bearer-token auth."""

from services.common.rpc.client import create_channel, default_service_config
from services.common.rpc.server import ServerHandle, serve_until_signal, start_server

__all__ = ["ServerHandle", "create_channel", "default_service_config", "serve_until_signal", "start_server"]
