"""aioserve: an asyncio LLM serving engine with continuous batching and pluggable schedulers."""

from aioserve.config import EngineConfig
from aioserve.engine import AsyncEngine
from aioserve.errors import EngineError, EngineNotRunningError, RequestShedError
from aioserve.outputs import RequestOutput
from aioserve.request_meta import RequestMeta
from aioserve.sampling_params import SamplingParams

__all__ = [
    "AsyncEngine",
    "EngineConfig",
    "EngineError",
    "EngineNotRunningError",
    "RequestMeta",
    "RequestOutput",
    "RequestShedError",
    "SamplingParams",
]
__version__ = "0.1.0"
