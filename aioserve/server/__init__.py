"""The aiohttp server: OpenAI-compatible HTTP API, websocket, health and metrics.

Imports (checked by tests/test_import_rules.py):
    may import: aioserve, aioserve.dashboard, aioserve.scheduling, aioserve.server.schema,
        aioserve.server.openai, aioserve.server.ws,
        aioserve.runners.cpu.threads.thread_governor
    never at module level: torch, numpy, transformers
"""

from aioserve.server.app import METRICS_KEY, create_app
from aioserve.server.state import CONFIG_KEY, ENGINE_KEY, ServerConfig

__all__ = ["CONFIG_KEY", "ENGINE_KEY", "METRICS_KEY", "ServerConfig", "create_app"]
