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

from aioserve.engine.admission import REFUSAL_REASONS
from aioserve.reports.outcome import Outcome, of_item
from aioserve.workloads.body import body_fields
from aioserve.workloads.request import FIRST_WORD_ID, WorkloadRequest

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
    """One request in flight (seconds, ``time.perf_counter``), until it becomes an
    :class:`~aioserve.reports.outcome.Outcome`.

    ``chunk_times`` holds each chunk that carried tokens; over SSE each network read (events read
    together count once, as ``vllm bench serve`` counts a chunk)."""

    start: float = 0.0
    chunk_times: list[float] = field(default_factory=list)
    output_tokens: int = 0
    end: float = 0.0
    error: str | None = None
    cached_tokens: int = 0

    def outcome(self, item: WorkloadRequest, zero: float) -> Outcome:
        """What happened to ``item``, on a clock whose zero is the run's start ``zero``."""
        times = tuple(t - zero for t in self.chunk_times)
        error = self.error if self.error is not None or times else "no token arrived"
        return replace(of_item(item), arrival_s=self.start - zero,
                       output_tokens=self.output_tokens,
                       first_token_s=times[0] if times else None,
                       last_token_s=times[-1] if times else None,
                       finish_s=self.end - zero, error=error,
                       cached_tokens=self.cached_tokens, token_times=times)


async def sse_reads(blocks: AsyncIterator[bytes]) -> AsyncIterator[list[str]]:
    """The ``data:`` payloads of an SSE stream, grouped by the network read that completed them."""
    pending = b""
    async for block in blocks:
        *lines, pending = (pending + block).split(b"\n")
        payloads = [text[5:].strip() for raw in lines
                    if (text := raw.decode("utf-8").strip()).startswith("data:")]
        if payloads:
            yield payloads


def request_body(request: WorkloadRequest, prompt: list[int],
                 unix_start: float) -> dict[str, Any]:
    """The body of one request: its prompt, its cap as ``max_tokens`` (unset: its
    ``output_len``), greedy with EOS ignored, and its workload row's fields."""
    cap = request.max_tokens if request.max_tokens is not None else request.output_len
    return {"prompt": prompt, "max_tokens": cap, "temperature": 0.0, "ignore_eos": True,
            **body_fields(request, unix_start)}


def http_refusal(status: int, text: str) -> str | None:
    """A 429 of the server's admission limit as a simulated refusal reads (its reason
    first: ``queue_full: ... (HTTP 429)``, so the reports count it as refused, not as an
    error); None for any other answer."""
    if status != 429:
        return None
    try:
        error = json.loads(text)["error"]
        code, message = error["code"], error["message"]
    except (ValueError, KeyError, TypeError):
        return None
    return f"{code}: {message} (HTTP 429)" if code in REFUSAL_REASONS else None


def stream_error(error: dict[str, Any]) -> str:
    """An SSE error event as a failure reason: a refusal of the admission limit (a request
    ended by ``--max-queue-time-s`` after its stream began) as a simulated one reads."""
    code, message = error.get("code"), str(error.get("message"))
    return f"{code}: {message}" if code in REFUSAL_REASONS else f"error event: {message}"


async def send_completion(
    session: aiohttp.ClientSession, base_url: str, model: str | None, record: RequestRecord,
    request: WorkloadRequest, prompt: list[int], unix_start: float = 0.0,
) -> None:
    """Stream one completion into ``record`` (errors are recorded, not raised)."""
    body: dict[str, Any] = {**request_body(request, prompt, unix_start), "stream": True,
                            "stream_options": {"include_usage": True}}
    if model is not None:
        body["model"] = model
    record.start = time.perf_counter()
    try:
        stop = ({"X-Stop-After": str(request.stop_after)} if request.stop_after is not None
                else None)
        async with session.post(f"{base_url}/v1/completions", json=body,
                                headers=stop) as response:
            if response.status != 200:
                text = await response.text()
                record.error = (http_refusal(response.status, text)
                                or f"HTTP {response.status}: {text[:200]}")
                return
            async for payloads in sse_reads(response.content.iter_any()):
                arrived, carried = time.perf_counter(), False
                for data in payloads:
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    if isinstance(chunk.get("error"), dict):  # an error event ends the stream
                        record.error = stream_error(chunk["error"])
                        return
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

    async def send(self, request_id: str, record: RequestRecord, request: WorkloadRequest,
                   prompt: list[int], unix_start: float = 0.0) -> None:
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.queues[request_id] = queue
        record.start = time.perf_counter()
        await self.ws.send_json({
            "type": "generate", "id": request_id, **request_body(request, prompt, unix_start),
            **({"stop_after": request.stop_after} if request.stop_after is not None else {}),
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
                code, text = message.get("code"), str(message.get("message"))
                record.error = f"{code}: {text}" if code in REFUSAL_REASONS else text
                break
        record.end = time.perf_counter()
        del self.queues[request_id]

    async def close(self) -> None:
        await self.ws.close()
        await asyncio.gather(self._reader, return_exceptions=True)


async def with_caps(session: aiohttp.ClientSession, base_url: str,
                    requests: list[WorkloadRequest]) -> list[WorkloadRequest]:
    """Requests with no cap get the context left as ``max_tokens`` (the
    server's ``max_model_len`` from ``/v1/models``; unknown: ``output_len``, said on stderr)."""
    if not any(r.max_tokens is None for r in requests):
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
            if r.max_tokens is None else r for r in requests]


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


def send_times(requests: list[WorkloadRequest], request_rate: float, seed: int,
               burstiness: float = 1.0, at_arrivals: bool = False) -> list[float]:
    """Seconds after the start to send each request: with ``at_arrivals`` its ``arrival_s``
    (a workload's clock), else the arrivals of :func:`arrival_gaps`."""
    if at_arrivals:
        return [request.arrival_s for request in requests]
    times, t = [], 0.0
    for gap in arrival_gaps(len(requests), request_rate, seed, burstiness):
        t += gap
        times.append(t)
    return times


async def run_serving(
    base_url: str,
    requests: list[WorkloadRequest],
    *,
    request_rate: float = math.inf,
    at_arrivals: bool = False,
    vocab_size: int = 512,
    endpoint: str = "auto",
    model: str | None = None,
    seed: int = 0,
    progress: bool = False,
    api_key: str | None = None,
    burstiness: float = 1.0,
    max_concurrency: int | None = None,
) -> tuple[list[Outcome], float, str]:
    """Send ``requests`` and wait for all; returns their outcomes (request order, seconds
    after the start), the wall seconds and the endpoint used. ``at_arrivals``: send each at
    its ``arrival_s``, else at ``request_rate``; ``vocab_size``: of the prompts drawn for
    requests without token ids. ``api_key`` goes as a Bearer token. ``burstiness``: see
    :func:`arrival_gaps`; ``max_concurrency``: most requests in flight, a later one is sent
    (and its TTFT counted) when one ends, as vLLM bench's ``--max-concurrency``.

    Raises:
        ValueError: unknown endpoint. aiohttp.ClientError: the server is unreachable (ws).
        AuthenticationError: the server refused the key (or wants one)."""
    from tqdm import tqdm

    if endpoint not in ("auto", "completions", "ws"):
        raise ValueError(f"endpoint must be auto, completions or ws, got {endpoint!r}")
    base_url = base_url.rstrip("/")
    records = [RequestRecord() for _ in requests]
    prompts = [r.prompt_token_ids(vocab_size, FIRST_WORD_ID) for r in requests]
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
                await ws.send(f"b{index}", records[index], requests[index], prompts[index],
                              unix_start)
            else:
                await send_completion(session, base_url, model, records[index], requests[index],
                                      prompts[index], unix_start)

        async def one(index: int) -> None:
            if limit is None:
                await send(index)
            else:
                async with limit:
                    await send(index)
            bar.update(1)

        tasks = []
        start, unix_start = time.perf_counter(), time.time()
        times = send_times(requests, request_rate, seed, burstiness, at_arrivals)
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
    return [r.outcome(item, start) for r, item in zip(records, requests)], duration, endpoint
