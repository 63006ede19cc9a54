"""The Ray Serve ingress: forwards each request as received to an :class:`EngineReplica`."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from aioserve.deploy.contract_router import router_views
from aioserve.deploy.forwarded import (
    FORWARDED_HEADERS,
    REPLICA_HEADER,
    ForwardedRequest,
    ResponseHead,
)
from aioserve.deploy.route_request import Encode, route_request
from aioserve.server.errors import error_body

logger = logging.getLogger("aioserve.deploy")

#: Seconds before the first retry of a request whose replica failed; doubles each time (Serve
#: may route to a dead replica until its controller notices the death).
RETRY_DELAY = 0.25
#: Serve application name of the app, and the engine replicas' deployment name.
APP_NAME = "aioserve"
REPLICA_DEPLOYMENT = "EngineReplica"
#: Seconds a client refused by Serve's queue bound is told to wait.
BACKPRESSURE_RETRY_AFTER_S = 1


def backpressure(exc: BackPressureError) -> JSONResponse:
    """429 ``queue_full`` with ``Retry-After``: Serve's ``max_queued_requests`` is reached."""
    body = error_body(429, f"the server is at capacity: {exc}; retry later", code="queue_full")
    return JSONResponse(body, status_code=429,
                        headers={"Retry-After": str(BACKPRESSURE_RETRY_AFTER_S)})


def replica_failed(exc: BaseException) -> dict[str, object]:
    message = f"the replica serving this request failed: {type(exc).__name__}: {exc}"
    return error_body(503, message.splitlines()[0], code="replica_failed")


class OpenAIIngress:
    """Forwards every HTTP request to a replica, retrying one that fails before answering.
    ``GET /health`` is 200 only when its router sees ``target_replicas`` engine replicas
    (ready means ready: a request sent then may go to any of them)."""

    def __init__(
        self, replica: DeploymentHandle[Any], tokenizer: str | None = None,
        block_size: int = 16, retries: int = 4, max_model_len: int | None = None,
        target_replicas: int = 1,
    ) -> None:
        self.target_replicas = target_replicas
        self.replica = replica.options(stream=True)
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.retries = retries
        self.encode: Encode | None = None
        if tokenizer is not None:  # the router hashes token blocks, as the engine caches them
            try:
                from transformers import AutoTokenizer

                loaded = AutoTokenizer.from_pretrained(tokenizer)
                self.encode = lambda text: loaded(text).input_ids
            except (OSError, ValueError) as exc:
                logger.warning("no tokenizer for routing (token-id prompts only): %r", exc)

    async def __call__(self, request: Request) -> Response:
        """The replica's answer plus the ``x-aioserve-replica`` header."""
        response = await self._forward(request)
        if request.url.path != "/health" or response.status_code != 200:
            return response
        seen = router_views().get(REPLICA_DEPLOYMENT, 0)  # known once a request went by
        if seen < self.target_replicas:
            body = {"status": f"starting: the router sees {seen} of {self.target_replicas} "
                              "engine replicas", "replicas": seen}
            return JSONResponse(body, status_code=503)
        return JSONResponse({"status": "ok", "replicas": seen})

    async def _forward(self, request: Request) -> Response:
        if request.url.path == "/ws":
            body = error_body(404, "the websocket /ws is not served on Ray Serve; use the "
                              "HTTP routes", code="not_found")
            return JSONResponse(body, status_code=404)
        raw = await request.body()
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        headers = {name: request.headers[name] for name in FORWARDED_HEADERS
                   if name in request.headers}
        forwarded = ForwardedRequest(request.method, path, headers, raw)
        route = route_request(raw, self.encode, self.block_size,
                              max_model_len=self.max_model_len)
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(RETRY_DELAY * 2 ** (attempt - 1))  # backoff, not sync
            stream = self.replica.forward.remote(
                forwarded, route=route if attempt == 0 else None  # retries: by load
            )
            assert isinstance(stream, DeploymentResponseGenerator)  # options(stream=True)
            try:
                head = await stream.__anext__()
            except BackPressureError as exc:  # Serve's queue bound: no retry
                stream.cancel()
                return backpressure(exc)
            except Exception as exc:  # the replica died or was unreachable
                stream.cancel()
                logger.warning("replica failed before answering (try %d): %r", attempt, exc)
                failure = exc
                continue
            headers = {**head.headers, REPLICA_HEADER: head.replica}
            return StreamingResponse(
                _body(stream, head), status_code=head.status, headers=headers
            )
        return JSONResponse(replica_failed(failure), status_code=503)


async def _body(
    stream: DeploymentResponseGenerator[Any], head: ResponseHead
) -> AsyncIterator[bytes]:
    """The replica's body; an SSE error event if it fails mid-stream."""
    try:
        async for chunk in stream:
            yield chunk
    except Exception as exc:
        logger.warning("replica failed mid-answer: %r", exc)
        if head.is_event_stream:
            yield b"data: " + json.dumps(replica_failed(exc)).encode() + b"\n\n"
    finally:
        stream.cancel()
