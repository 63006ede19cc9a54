"""``aioserve serve``: the HTTP and websocket server, with graceful shutdown."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from aioserve.commands.common import add_engine_options, engine_config
from aioserve.commands.serve_ray import add_ray_options, run_ray
from aioserve.server import ServerConfig, create_app
from aioserve.server.state import ENGINE_KEY

logger = logging.getLogger("aioserve.serve")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``serve`` command."""
    parser = subparsers.add_parser("serve", help="serve the model over HTTP and websocket")
    add_engine_options(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    parser.add_argument("--served-model-name", default=None,
                        help="the model name clients send (default: the --model path)")
    parser.add_argument("--chat-template", default=None, metavar="FILE",
                        help="Jinja chat template file (overrides the tokenizer's)")
    parser.add_argument("--max-body-bytes", type=int, default=1024**2,
                        help="largest request body or websocket message in bytes")
    parser.add_argument("--ws-max-pending", type=int, default=256,
                        help="messages queued per websocket before its generations pause")
    parser.add_argument("--ws-stall-timeout", type=float, default=5.0,
                        help="seconds a websocket may not read before its requests are aborted")
    parser.add_argument("--shutdown-timeout", type=float, default=10.0,
                        help="seconds running requests get to finish on SIGINT/SIGTERM "
                             "(new ones get 503 meanwhile; the rest then end with an error)")
    add_ray_options(parser)
    return parser


def server_config(args: argparse.Namespace) -> ServerConfig:
    """ServerConfig from parsed options.

    Raises:
        ValueError: an option is out of range, or the chat template file is unreadable.
    """
    template = None
    if args.chat_template is not None:
        try:
            template = Path(args.chat_template).read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"--chat-template: cannot read {args.chat_template}: {exc}") from None
    return ServerConfig(
        served_model_name=args.served_model_name,
        chat_template=template,
        max_body_bytes=args.max_body_bytes,
        ws_max_pending=args.ws_max_pending,
        ws_stall_timeout=args.ws_stall_timeout,
    )


#: Seconds handlers get to write their last event after the engine has stopped.
CLOSE_GRACE = 1.0


async def drain(app: web.Application, shutdown_timeout: float) -> None:
    """Graceful stop of the engine, as vLLM and TGI do on SIGTERM: admit nothing more
    (new requests get 503, ``/health`` 503), end queued requests that never started
    with an error, let running ones finish for up to ``shutdown_timeout`` seconds,
    then stop the engine, which ends every remaining stream with an error event (SSE
    ``data: {"error": ...}``, websocket ``error``)."""
    engine = app[ENGINE_KEY]
    if not engine.is_running:
        return
    engine.drain()
    if not await engine.wait_idle(shutdown_timeout):
        logger.warning("shutdown timeout: ending the requests still running with an error")
    await engine.shutdown()


async def serve(
    app: web.Application, host: str, port: int, shutdown_timeout: float,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve ``app`` until SIGINT or SIGTERM, then :func:`drain` the engine (in-flight
    requests get ``shutdown_timeout`` seconds), stop listening, close websockets and
    exit, in at most ``shutdown_timeout`` + about 2 seconds. Prints ``listening on
    http://HOST:PORT`` once ready (and passes that URL to ``on_ready``)."""
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=CLOSE_GRACE)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):  # before the model loads: a stop while
        loop.add_signal_handler(sig, stop.set)  # loading still exits cleanly (status 0)
    try:
        await runner.setup()
        if stop.is_set():
            return
        site = web.TCPSite(runner, host, port)
        await site.start()
        for address in runner.addresses:
            url = f"http://{address[0]}:{address[1]}"
            print(f"listening on {url}", flush=True)
            if on_ready is not None:
                on_ready(url)
        await stop.wait()
        logger.info("shutting down: admitting nothing, finishing in-flight requests "
                    "(at most %.1f s)", shutdown_timeout)
        await drain(app, shutdown_timeout)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        await runner.cleanup()
    logger.info("stopped")


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM, then shut down gracefully; exit status 0. With
    ``--ray``, serve on Ray Serve instead (:func:`run_ray`)."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.ray:
        return run_ray(args, server_config(args))
    app = create_app(engine_config(args), server_config(args))
    asyncio.run(serve(app, args.host, args.port, args.shutdown_timeout))
    return 0
