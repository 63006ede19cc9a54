"""The aiohttp server: health, websocket, and the HTTP APIs."""

from aioserve.server.app import ENGINE_KEY, create_app

__all__ = ["ENGINE_KEY", "create_app"]
