"""The ``aioserve`` command line: generate, serve, and the commands each module adds."""

from __future__ import annotations

import argparse
import importlib
import sys

#: Sub-command modules; each defines ``add_parser(subparsers)`` and ``run(args) -> int``.
COMMAND_MODULES = (
    "aioserve.commands.generate",
    "aioserve.commands.serve",
    "aioserve.commands.simulate",
    "aioserve.commands.bench",
)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one sub-parser per command module."""
    parser = argparse.ArgumentParser(prog="aioserve", description="asyncio LLM serving engine")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        module = importlib.import_module(name)
        sub = module.add_parser(subparsers)
        sub.set_defaults(handler=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``aioserve`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except ValueError as exc:
        print(f"aioserve: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # e.g. a --model path that does not exist
        model = getattr(args, "model", None)
        print(f"aioserve: error: cannot load {model or 'a file'}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
