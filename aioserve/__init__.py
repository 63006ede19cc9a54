"""aioserve: an asyncio LLM serving engine with continuous batching and pluggable schedulers.

The top-level modules are the nouns every room shares; the engine is ``aioserve.engine``.
"""

from importlib.metadata import PackageNotFoundError, version

from aioserve.config import EngineConfig
from aioserve.engine import AsyncEngine
from aioserve.errors import (
    AdmissionError,
    EngineError,
    EngineNotRunningError,
    QueueFullError,
    QueueTimeoutError,
    RequestShedError,
)
from aioserve.outputs import RequestOutput
from aioserve.request_meta import RequestMeta
from aioserve.sampling_params import SamplingParams

__all__ = [
    "AdmissionError",
    "AsyncEngine",
    "EngineConfig",
    "EngineError",
    "EngineNotRunningError",
    "RequestMeta",
    "QueueFullError",
    "QueueTimeoutError",
    "RequestOutput",
    "RequestShedError",
    "SamplingParams",
]
try:
    __version__ = version("aioserve")  # pyproject.toml's, as installed
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
