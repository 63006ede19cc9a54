"""``aioserve serve``: the HTTP and websocket server."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from aiohttp import web

from aioserve.commands.common import add_engine_options, engine_config
from aioserve.server import create_app


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``serve`` command."""
    parser = subparsers.add_parser("serve", help="serve the model over HTTP and websocket")
    add_engine_options(parser)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    return parser


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM, then shut down gracefully; exit status 0."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(engine_config(args))
    web.run_app(app, host=args.host, port=args.port, shutdown_timeout=10.0)
    return 0
