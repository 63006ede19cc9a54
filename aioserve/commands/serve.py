"""``aioserve serve``: the HTTP and websocket server, with graceful shutdown."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import ssl
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from aioserve.commands.common import (
    add_engine_options,
    engine_config,
    flag_error,
    non_negative_float,
    positive_float,
    positive_int,
    quiet_loading,
)
from aioserve.commands.preflight import SERVE, preflight
from aioserve.commands.serve_ray import add_ray_options, run_ray
from aioserve.config import EngineConfig
from aioserve.engine.admission import DEFAULT_WAITING_BATCHES, NO_LIMIT, serve_max_waiting
from aioserve.server import ServerConfig, create_app
from aioserve.server.operator_log import StatsLogger, startup_line, startup_summary
from aioserve.server.security_flags import API_KEY_ENV, api_key_of, tls_context
from aioserve.server.state import ENGINE_KEY, served_model_name
from aioserve.startup_clock import PhaseClock, process_age_s

if TYPE_CHECKING:
    from aioserve.commands.common import Subparsers

logger = logging.getLogger("aioserve.serve")


def add_parser(subparsers: Subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("serve", help="serve the model over HTTP and websocket")
    add_engine_options(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    parser.add_argument("--served-model-name", default=None,
                        help="the model name clients send (default: the --model "
                             "directory's own name, or the hub id as given)")
    parser.add_argument("--chat-template", default=None, metavar="FILE",
                        help="Jinja chat template file (overrides the tokenizer's)")
    parser.add_argument("--max-body-bytes", type=int, default=1024**2,
                        help="largest request body or websocket message in bytes")
    parser.add_argument("--ws-max-pending", type=positive_int, default=256,
                        help="messages queued per websocket before its generations pause")
    parser.add_argument("--ws-stall-timeout", type=float, default=5.0,
                        help="seconds a websocket may not read before its requests are aborted")
    parser.add_argument("--shutdown-timeout", type=non_negative_float, default=10.0,
                        help="seconds running requests get to finish on SIGINT/SIGTERM "
                             "(new ones get 503 meanwhile; the rest then end with an error)")
    parser.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                        help="require 'Authorization: Bearer KEY' on /v1/*, the websockets "
                        "and /metrics (the dashboard asks for it once); visible in ps: "
                        "prefer --api-key-file or $AIOSERVE_API_KEY (the default, else no "
                        "key; /health open); an empty key is an error")
    parser.add_argument("--api-key-file", default=None, metavar="FILE",
                        help="read the key from FILE's first line (e.g. a mounted secret; "
                        "keep it mode 600)")
    parser.add_argument("--metrics-public", action="store_true",
                        help="with a key, leave /metrics open (a scraper without the key); "
                        "its tenant labels are then keyed hashes t-<12 hex>, at most 20 "
                        "plus 'other'")
    parser.add_argument("--max-waiting", "--max-queued-requests", dest="max_waiting",
                        type=max_waiting_arg, default=None, metavar="N",
                        help="most requests waiting for a slot; one more gets 429 with "
                        "Retry-After (a named error on the websocket); default "
                        f"{DEFAULT_WAITING_BATCHES} x --max-num-seqs; '{NO_LIMIT}': no limit")
    parser.add_argument("--max-queue-time-s", type=positive_float, default=None,
                        metavar="SECONDS",
                        help="end a request not scheduled this long after it arrived with "
                        "429 queue_timeout, freeing its place; default: no limit")
    tls = parser.add_argument_group("TLS (HTTPS and WSS)")
    tls.add_argument("--ssl-certfile", default=None, metavar="PEM",
                     help="the server's certificate (chain), PEM")
    tls.add_argument("--ssl-keyfile", default=None, metavar="PEM",
                     help="its private key, PEM (default: in --ssl-certfile)")
    tls.add_argument("--ssl-ca-certs", default=None, metavar="PEM",
                     help="CA certificates: clients must present a certificate they signed")
    parser.add_argument("--allowed-origins", default="", metavar="ORIGINS",
                        help="comma-separated origins browsers may call from (CORS), "
                        "or '*' for any (default: none)")
    parser.add_argument("--log-level", default="info",
                        choices=["debug", "info", "warning", "error"], help="stderr log level")
    parser.add_argument("--stats-log-interval", type=non_negative_float, default=10.0,
                        metavar="SECONDS",
                        help="a stats line at most this often while busy (0: never)")
    parser.add_argument("--step-log", default=None, metavar="FILE.jsonl",
                        help="write each engine step to FILE, overwritten at start (JSON "
                        "lines, about 180 bytes a step and 56 a row); aioserve calibrate "
                        "--from-steps FILE fits the simulator on this server's own steps")
    add_ray_options(parser)
    parser.set_defaults(exit_when_done=True)  # the console command exits at once once stopped
    return parser


def server_config(args: argparse.Namespace) -> ServerConfig:
    """ServerConfig from parsed options; ValueError naming the option."""
    template = None
    explicit = args.api_key if args.api_key != os.environ.get(API_KEY_ENV) else None
    api_key = api_key_of(explicit, args.api_key_file)
    if args.chat_template is not None:
        try:
            template = Path(args.chat_template).read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"--chat-template: cannot read {args.chat_template}: {exc}") from None
    try:
        return ServerConfig(
            served_model_name=args.served_model_name,
            chat_template=template,
            max_body_bytes=args.max_body_bytes,
            ws_max_pending=args.ws_max_pending,
            ws_stall_timeout=args.ws_stall_timeout,
            api_key=api_key,
            metrics_public=args.metrics_public,
            allowed_origins=tuple(o.strip() for o in args.allowed_origins.split(",")
                                  if o.strip()),
            step_log=args.step_log,
        )
    except ValueError as exc:
        raise flag_error(exc, args) from None


def max_waiting_arg(value: str) -> int | str:
    """An argparse type: ``--max-waiting``'s positive integer, or ``NO_LIMIT``."""
    if value.strip().lower() == NO_LIMIT:
        return NO_LIMIT
    try:
        return positive_int(value)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (or '{NO_LIMIT}': no limit)") from None


def admission_config(config: EngineConfig, args: argparse.Namespace) -> EngineConfig:
    """``config`` with ``--max-waiting`` (by default ``DEFAULT_WAITING_BATCHES`` x
    ``max_num_seqs``) and ``--max-queue-time-s`` (the engine enforces them: see
    :mod:`aioserve.engine.admission`)."""
    return replace(config, max_waiting=serve_max_waiting(args.max_waiting, config.max_num_seqs),
                   max_queue_time_s=args.max_queue_time_s)


#: Seconds handlers get to write their last event after the engine has stopped.
CLOSE_GRACE = 1.0


async def drain(app: web.Application, shutdown_timeout: float) -> None:
    """Graceful stop, as vLLM and TGI on SIGTERM: admit nothing (503), end queued requests, let
    running ones finish for up to ``shutdown_timeout`` seconds, then stop the engine (remaining
    streams end with an error event)."""
    engine = app[ENGINE_KEY]
    if not engine.is_running:
        return
    engine.drain()
    if not await engine.wait_idle(shutdown_timeout):
        logger.warning("shutdown timeout: ending the requests still running with an error")
    await engine.shutdown()


def bind(host: str, port: int) -> list[socket.socket]:
    """Sockets bound to every address of ``host`` at ``port``, not yet listening (nothing
    connects before the server is ready); ValueError naming ``--host/--port`` when they cannot be
    bound."""
    sockets: list[socket.socket] = []
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((address[0], port, *address[2:]))
            port = sock.getsockname()[1]
    except OSError as exc:  # also socket.gaierror
        for sock in sockets:
            sock.close()
        raise ValueError(f"--host/--port: cannot listen on {host}:{port}: "
                         f"{exc.strerror or exc}") from None
    return sockets


async def serve(
    app: web.Application, host: str, port: int, shutdown_timeout: float,
    on_ready: Callable[[str], None] | None = None, ssl_context: ssl.SSLContext | None = None,
) -> None:
    """Serve ``app`` until SIGINT or SIGTERM, then :func:`drain` and exit within
    ``shutdown_timeout`` + about 2 s; prints ``listening on http://HOST:PORT`` (``https``
    with ``ssl_context``) once ready. ValueError before the model loads when
    ``host:port`` cannot be bound."""
    sockets = bind(host, port)
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=CLOSE_GRACE)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):  # before the model loads: a stop while
        loop.add_signal_handler(sig, stop.set)  # loading still exits cleanly (status 0)
    try:
        await runner.setup()
        if stop.is_set():
            return
        for sock in sockets:
            await web.SockSite(runner, sock, ssl_context=ssl_context).start()
        scheme = "https" if ssl_context is not None else "http"
        for address in runner.addresses:
            url = f"{scheme}://{address[0]}:{address[1]}"
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
        for sock in sockets:  # those no site took over
            sock.close()
    logger.info("stopped")


def add_operator_log(app: web.Application, stats_interval: float,
                     clock: PhaseClock | None = None) -> None:
    """Log the start-up summary, then a stats line every ``stats_interval`` seconds (0: none)."""
    engine = app[ENGINE_KEY]
    stats = StatsLogger(engine, stats_interval) if stats_interval > 0 else None

    async def on_startup(app: web.Application) -> None:
        if clock is not None:
            clock.mark("engine start")
        logger.info("engine ready:\n%s", startup_summary(engine, served_model_name(app)))
        if stats is not None:
            stats.attach()

    async def on_cleanup(app: web.Application) -> None:
        if stats is not None:
            stats.detach()

    app.on_startup.append(on_startup)  # after the engine's start (cleanup_ctx runs first)
    app.on_cleanup.insert(0, on_cleanup)


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM; options are checked before torch loads."""
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in [0, 65535], got {args.port}")
    config = admission_config(engine_config(args), args)  # every refusal that needs no
    preflight(args, SERVE)  # model, key file, TLS files: before torch loads
    settings = server_config(args)  # from checked inputs
    tls = tls_context(args.ssl_certfile, args.ssl_keyfile, args.ssl_ca_certs)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_loading(args.log_level == "debug")
    if args.ray:
        return run_ray(args, config, settings)
    process_s, clock = process_age_s(), PhaseClock()
    import aioserve.runners.torch.runner  # noqa: F401  torch, transformers: timed

    clock.mark("imports (torch, transformers)")
    app = create_app(config, settings)
    add_operator_log(app, args.stats_log_interval, clock)
    if args.step_log is not None:
        logger.info("writing each engine step to %s", args.step_log)

    def ready(url: str) -> None:
        clock.mark("HTTP server")
        logger.info(startup_line(process_s, clock, app[ENGINE_KEY].runner))

    if settings.api_key is None and args.host not in ("127.0.0.1", "localhost", "::1"):
        logger.warning("serving on %s without an API key: anyone who reaches it may call "
                       "it and read /metrics and the dashboard (see docs/security.md)",
                       args.host)
    asyncio.run(serve(app, args.host, args.port, args.shutdown_timeout, ready, tls))
    return 0
