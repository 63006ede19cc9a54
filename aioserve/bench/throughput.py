"""Offline throughput, every request at t=0 with EOS ignored."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from typing import Any

from aioserve.config import EngineConfig
from aioserve.engine import AsyncEngine
from aioserve.sampling_params import SamplingParams
from aioserve.workloads.request import WorkloadRequest
from aioserve.workloads.synthetic import token_request


@dataclass(frozen=True)
class ThroughputResult:
    """One backend's run (loading excluded; None where not measured)."""

    backend: str
    num_requests: int
    elapsed_s: float
    prompt_tokens: int
    output_tokens: int
    mean_ttft_ms: float | None = None
    cached_prompt_tokens: int | None = None

    @classmethod
    def of(
        cls, backend: str, requests: list[WorkloadRequest], elapsed_s: float, **measured: Any
    ) -> ThroughputResult:
        prompt = sum(r.prompt_len for r in requests)
        output = sum(r.output_len for r in requests)
        return cls(backend, len(requests), elapsed_s, prompt, output, **measured)

    @property
    def prefix_hit_rate(self) -> float | None:
        if self.cached_prompt_tokens is None:
            return None
        return self.cached_prompt_tokens / self.prompt_tokens

    @property
    def requests_per_s(self) -> float:
        return self.num_requests / self.elapsed_s

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.elapsed_s

    @property
    def total_tokens_per_s(self) -> float:
        return (self.prompt_tokens + self.output_tokens) / self.elapsed_s

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {
            "requests_per_s": self.requests_per_s,
            "output_tokens_per_s": self.output_tokens_per_s,
            "total_tokens_per_s": self.total_tokens_per_s,
            "prefix_hit_rate": self.prefix_hit_rate,
        }

    def summary(self) -> str:
        line = (
            f"{self.backend:>9}: {self.elapsed_s:7.2f} s  {self.requests_per_s:8.2f} requests/s  "
            f"{self.output_tokens_per_s:9.1f} output tokens/s  "
            f"{self.total_tokens_per_s:9.1f} total tokens/s"
        )
        if self.mean_ttft_ms is not None:
            line += f"  TTFT {self.mean_ttft_ms:8.1f} ms"
        if self.prefix_hit_rate is not None:
            line += f"  prefix hits {self.prefix_hit_rate:6.1%}"
        return line


def _greedy(request: WorkloadRequest) -> SamplingParams:
    return SamplingParams(max_tokens=request.output_len, temperature=0.0, ignore_eos=True)


async def run_engine(
    engine: AsyncEngine,
    requests: list[WorkloadRequest],
    *,
    progress: bool = False,
    backend: str = "aioserve",
) -> tuple[ThroughputResult, list[list[int]]]:
    """Submit every request at once and wait; the result and each request's token ids."""
    from tqdm import tqdm

    outputs: list[list[int]] = [[] for _ in requests]
    ttft = [0.0 for _ in requests]
    cached = [0 for _ in requests]
    bar = tqdm(total=len(requests), desc="aioserve", unit="req", disable=not progress)

    async def consume(index: int, request: WorkloadRequest) -> None:
        async for out in engine.generate(list(request.prompt_ids), _greedy(request)):
            if not outputs[index]:
                ttft[index] = time.perf_counter() - start
            outputs[index].extend(out.token_ids)
            cached[index] = out.num_cached_tokens
        bar.update(1)

    start = time.perf_counter()
    await asyncio.gather(*(consume(i, r) for i, r in enumerate(requests)))
    elapsed = time.perf_counter() - start
    bar.close()
    for request, tokens in zip(requests, outputs):
        if len(tokens) != request.output_len:
            raise RuntimeError(f"a request produced {len(tokens)} of {request.output_len} tokens")
    result = ThroughputResult.of(
        backend, requests, elapsed, mean_ttft_ms=1000 * sum(ttft) / len(ttft),
        cached_prompt_tokens=sum(cached),
    )
    return result, outputs


def run_aioserve(
    config: EngineConfig,
    requests: list[WorkloadRequest],
    *,
    progress: bool = False,
    backend: str = "aioserve",
    tokenizer: bool = True,
) -> tuple[ThroughputResult, list[list[int]]]:
    """Start and warm an engine (untimed), empty its prefix cache, then time :func:`run_engine`."""

    async def main() -> tuple[ThroughputResult, list[list[int]]]:
        async with started_engine(config, tokenizer) as engine:
            await run_engine(engine, [token_request(i, list(r.prompt_ids), 4)
                                      for i, r in enumerate(requests[:2])])
            engine.reset_prefix_cache()
            return await run_engine(engine, requests, progress=progress, backend=backend)

    return asyncio.run(main())


@contextlib.asynccontextmanager
async def started_engine(config: EngineConfig, tokenizer: bool = True
                         ) -> AsyncIterator[AsyncEngine]:
    """The started engine of ``config``; ``tokenizer=False`` loads none (a random model)."""
    runner = None
    if not tokenizer:  # an engine given its runner loads no tokenizer
        from aioserve.runners.torch.runner import TorchRunner

        runner = await asyncio.to_thread(TorchRunner, config)
    try:
        async with AsyncEngine(config, runner=runner) as engine:
            yield engine
    finally:
        if runner is not None:  # also when the engine failed to start (close is idempotent)
            runner.close()
