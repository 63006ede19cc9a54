"""The serving benchmark client: Poisson or replayed arrivals over SSE or the websocket."""

from __future__ import annotations

import asyncio
import json
import math
import random
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp

from aioserve.bench.workloads import BenchRequest

__all__ = ["AuthenticationError", "RequestRecord", "run_serving"]


class AuthenticationError(Exception):
    """The server answered 401: the API key is missing or wrong."""


def refused(base_url: str, api_key: str | None, detail: str) -> AuthenticationError:
    advice = ("the API key was refused" if api_key
              else "the server needs an API key (--api-key, $OPENAI_API_KEY or "
                   "$AIOSERVE_API_KEY)")
    return AuthenticationError(f"{base_url}: 401 Unauthorized: {advice}: {detail}")


@dataclass
class RequestRecord:
    """One request's timings (seconds, ``time.perf_counter``).

    ``chunk_times`` holds each chunk that carried tokens; over SSE each network read (events read
    together count once, as ``vllm bench serve`` counts a chunk). ``slo_ms``: its own (TTFT,
    TPOT) objectives, None for the run's."""

    prompt_len: int
    output_len: int
    start: float = 0.0
    chunk_times: list[float] = field(default_factory=list)
    output_tokens: int = 0
    end: float = 0.0
    error: str | None = None
    cached_tokens: int = 0
    group: tuple[str | None, int] = (None, 0)
    slo_ms: tuple[float | None, float | None] = (None, None)

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.chunk_times)

    @property
    def ttft(self) -> float:
        return self.chunk_times[0] - self.start

    @property
    def e2e(self) -> float:
        return self.end - self.start

    @property
    def tpot(self) -> float | None:
        """Mean seconds per output token after the first (None for one token)."""
        if self.output_tokens < 2:
            return None
        return (self.chunk_times[-1] - self.chunk_times[0]) / (self.output_tokens - 1)

    @property
    def itl(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:])]


async def sse_reads(blocks: AsyncIterator[bytes]) -> AsyncIterator[list[str]]:
    """The ``data:`` payloads of an SSE stream, grouped by the network read that completed them."""
    pending = b""
    async for block in blocks:
        *lines, pending = (pending + block).split(b"\n")
        payloads = [text[5:].strip() for raw in lines
                    if (text := raw.decode("utf-8").strip()).startswith("data:")]
        if payloads:
            yield payloads


def extra_fields(request: BenchRequest, unix_start: float) -> dict[str, Any]:
    """The request's body fields beyond prompt and length, its deadline as Unix time."""
    fields = dict(request.fields)
    if request.deadline_s is not None:
        fields["deadline"] = unix_start + request.deadline_s
    return fields


async def send_completion(
    session: aiohttp.ClientSession, base_url: str, model: str | None, record: RequestRecord,
    request: BenchRequest, unix_start: float = 0.0,
) -> None:
    """Stream one completion into ``record`` (errors are recorded, not raised)."""
    body: dict[str, Any] = {
        "prompt": request.prompt_token_ids, "max_tokens": request.sent_max_tokens,
        "temperature": 0.0, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True}, **extra_fields(request, unix_start),
    }
    if model is not None:
        body["model"] = model
    record.start = time.perf_counter()
    try:
        stop = ({"X-Stop-After": str(request.stop_after)} if request.stop_after is not None
                else None)
        async with session.post(f"{base_url}/v1/completions", json=body,
                                headers=stop) as response:
            if response.status != 200:
                record.error = f"HTTP {response.status}: {(await response.text())[:200]}"
                return
            async for payloads in sse_reads(response.content.iter_any()):
                arrived, carried = time.perf_counter(), False
                for data in payloads:
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    choices = chunk.get("choices") or []
                    if choices and (choices[0].get("text")
                                    or choices[0].get("finish_reason") is None):
                        carried = True
                        record.output_tokens += 1
                    usage = chunk.get("usage")
                    if usage:
                        record.output_tokens = int(usage.get("completion_tokens",
                                                             record.output_tokens))
                        details = usage.get("prompt_tokens_details") or {}
                        record.cached_tokens = int(details.get("cached_tokens") or 0)
                if carried:  # one arrival per read: events read together are no 0-ms gap
                    record.chunk_times.append(arrived)
    except (aiohttp.ClientError, ValueError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"
    finally:
        record.end = time.perf_counter()


class WebsocketClient:
    """One ``/ws`` shared by all requests; messages routed by id."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.queues: dict[str, asyncio.Queue[dict[str, Any]]] = {}
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for msg in self.ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            message = json.loads(msg.data)
            queue = self.queues.get(str(message.get("id")))
            if queue is not None:
                queue.put_nowait(message)
        for queue in self.queues.values():
            queue.put_nowait({"type": "error", "message": "websocket closed"})

    async def send(self, request_id: str, record: RequestRecord, request: BenchRequest,
                   unix_start: float = 0.0) -> None:
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.queues[request_id] = queue
        record.start = time.perf_counter()
        await self.ws.send_json({
            "type": "generate", "id": request_id, "prompt": request.prompt_token_ids,
            "max_tokens": request.sent_max_tokens, "temperature": 0.0, "ignore_eos": True,
            **({"stop_after": request.stop_after} if request.stop_after is not None else {}),
            **extra_fields(request, unix_start),
        })
        while True:
            message = await queue.get()
            if message["type"] == "token":
                record.chunk_times.append(time.perf_counter())
                record.output_tokens += len(message.get("token_ids") or [None])
            elif message["type"] == "done":
                record.output_tokens = message["usage"]["completion_tokens"]
                break
            else:
                record.error = str(message.get("message"))
                break
        record.end = time.perf_counter()
        del self.queues[request_id]

    async def close(self) -> None:
        await self.ws.close()
        await asyncio.gather(self._reader, return_exceptions=True)


async def with_caps(session: aiohttp.ClientSession, base_url: str,
                    requests: list[BenchRequest]) -> list[BenchRequest]:
    """Requests with a hidden stop and no cap get the context left as ``max_tokens`` (the
    server's ``max_model_len`` from ``/v1/models``; unknown: ``output_len``, said on stderr)."""
    if not any(r.stop_after is not None and r.max_tokens is None for r in requests):
        return requests
    context = None
    try:
        async with session.get(f"{base_url}/v1/models") as response:
            if response.status == 200:
                context = ((await response.json()).get("data") or [{}])[0].get("max_model_len")
    except aiohttp.ClientError:
        pass
    if not isinstance(context, int):
        print("bench serve: the server's context length is unknown; max_tokens = output_len "
              "(length-aware policies then see the true length)", file=sys.stderr)
        return requests
    return [replace(r, max_tokens=max(context - r.prompt_len, r.output_len))
            if r.stop_after is not None and r.max_tokens is None else r for r in requests]


async def detect_endpoint(
    session: aiohttp.ClientSession, base_url: str, api_key: str | None = None,
) -> tuple[str, str | None]:
    """``("completions", model)`` when ``GET /v1/models`` answers, else ``("ws", None)``."""
    try:
        async with session.get(f"{base_url}/v1/models") as response:
            if response.status == 401:
                raise refused(base_url, api_key, (await response.text())[:200])
            if response.status == 200:
                data = (await response.json()).get("data") or [{}]
                return "completions", data[0].get("id")
    except aiohttp.ClientError:
        pass
    return "ws", None


async def connect_ws(session: aiohttp.ClientSession, base_url: str,
                     api_key: str | None) -> WebsocketClient:
    """Open ``/ws``; AuthenticationError on 401, aiohttp.ClientError when unreachable."""
    try:
        return WebsocketClient(await session.ws_connect(f"{base_url}/ws"))
    except aiohttp.WSServerHandshakeError as exc:
        if exc.status == 401:
            raise refused(base_url, api_key, "GET /ws") from None
        raise


def arrival_gaps(num: int, request_rate: float, seed: int,
                 burstiness: float = 1.0) -> list[float]:
    """Gaps at ``request_rate`` per second: exponential (a Poisson process), or with
    ``burstiness`` != 1 gamma of that shape and the same mean, as vLLM bench's
    ``--burstiness``; zeros when the rate is infinite."""
    if math.isinf(request_rate):
        return [0.0] * num
    rng = random.Random(seed)
    if burstiness != 1.0:
        return [rng.gammavariate(burstiness, 1 / (request_rate * burstiness))
                for _ in range(num)]
    return [rng.expovariate(request_rate) for _ in range(num)]


def send_times(requests: list[BenchRequest], request_rate: float, seed: int,
               burstiness: float = 1.0) -> list[float]:
    """Seconds after the start to send each request: its ``arrival_s``, else the arrivals of
    :func:`arrival_gaps`."""
    times, t = [], 0.0
    gaps = arrival_gaps(len(requests), request_rate, seed, burstiness)
    for request, gap in zip(requests, gaps):
        t += gap
        times.append(request.arrival_s if request.arrival_s is not None else t)
    return times


async def run_serving(
    base_url: str,
    requests: list[BenchRequest],
    *,
    request_rate: float = math.inf,
    endpoint: str = "auto",
    model: str | None = None,
    seed: int = 0,
    progress: bool = False,
    api_key: str | None = None,
    burstiness: float = 1.0,
    max_concurrency: int | None = None,
) -> tuple[list[RequestRecord], float, str]:
    """Send ``requests`` and wait for all; returns the records (request order), the wall seconds
    and the endpoint used. ``api_key`` goes as a Bearer token. ``burstiness``: see
    :func:`arrival_gaps`; ``max_concurrency``: most requests in flight, a later one is sent
    (and its TTFT counted) when one ends, as vLLM bench's ``--max-concurrency``.

    Raises:
        ValueError: unknown endpoint. aiohttp.ClientError: the server is unreachable (ws).
        AuthenticationError: the server refused the key (or wants one)."""
    from tqdm import tqdm

    if endpoint not in ("auto", "completions", "ws"):
        raise ValueError(f"endpoint must be auto, completions or ws, got {endpoint!r}")
    base_url = base_url.rstrip("/")
    records = [RequestRecord(r.prompt_len, r.output_len,
                             group=(r.fields.get("user"), r.fields.get("priority", 0)),
                             slo_ms=(r.fields.get("ttft_slo_ms"), r.fields.get("tpot_slo_ms")))
               for r in requests]
    bar = tqdm(total=len(requests), desc="serve", unit="req", disable=not progress)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
        if endpoint != "ws":  # also checks the key before the first request
            found_endpoint, found = await detect_endpoint(session, base_url, api_key)
            endpoint = found_endpoint if endpoint == "auto" else endpoint
            model = model or found
        requests = await with_caps(session, base_url, requests)
        ws = None
        if endpoint == "ws":
            ws = await connect_ws(session, base_url, api_key)

        limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None

        async def send(index: int) -> None:
            if ws is not None:
                await ws.send(f"b{index}", records[index], requests[index], unix_start)
            else:
                await send_completion(session, base_url, model, records[index], requests[index],
                                      unix_start)

        async def one(index: int) -> None:
            if limit is None:
                await send(index)
            else:
                async with limit:
                    await send(index)
            bar.update(1)

        tasks = []
        start, unix_start = time.perf_counter(), time.time()
        times = send_times(requests, request_rate, seed, burstiness)
        for index in sorted(range(len(requests)), key=times.__getitem__):
            delay = start + times[index] - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(index)))
        await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
        if ws is not None:
            await ws.close()
    bar.close()
    return records, duration, endpoint
