"""The engine: the synchronous core, the step loop, output delivery and observation."""

from aioserve.engine.async_engine import AsyncEngine
from aioserve.engine.observation import EngineListener, StepSnapshot
from aioserve.engine.output import RequestStream

__all__ = ["AsyncEngine", "EngineListener", "RequestStream", "StepSnapshot"]
