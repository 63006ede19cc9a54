"""The aiohttp server: OpenAI-compatible HTTP API, websocket, health and metrics."""

from aioserve.server.app import METRICS_KEY, create_app
from aioserve.server.state import CONFIG_KEY, ENGINE_KEY, ServerConfig

__all__ = ["CONFIG_KEY", "ENGINE_KEY", "METRICS_KEY", "ServerConfig", "create_app"]
