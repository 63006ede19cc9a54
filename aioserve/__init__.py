"""aioserve: an asyncio LLM serving engine with continuous batching and pluggable schedulers.

The modules directly in this package are the serving core: the engine, its step loop,
the engine core (waiting and running requests, the KV block manager, prefix caching),
requests and their metadata, streams and detokenization; the scheduler contract is
``aioserve.scheduling``. The core owns state and
talks to a model only through ``runners/base.py`` (plain data); it loads the
TorchRunner inside a function, so ``import aioserve`` loads no torch.

Imports (checked by tests/test_import_rules.py):
    may import: aioserve.scheduling, aioserve.runners.base, aioserve.runners.torch
    never at module level: aioserve.runners.torch, torch, numpy, transformers
"""

from importlib.metadata import PackageNotFoundError, version

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
try:
    __version__ = version("aioserve")  # pyproject.toml's, as installed
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
