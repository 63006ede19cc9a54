"""The ``aioserve`` command line: generate, serve, and the commands each module adds."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import NoReturn

from aioserve import __version__

#: Sub-command modules; each defines ``add_parser(subparsers)`` and ``run(args) -> int``.
COMMAND_MODULES = (
    "aioserve.commands.generate",
    "aioserve.commands.serve",
    "aioserve.commands.simulate",
    "aioserve.commands.calibrate",
    "aioserve.commands.capacity",
    "aioserve.commands.bench",
    "aioserve.commands.policies",
    "aioserve.commands.env",
)


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` to an option's help unless the help already speaks of it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if "default" in text.lower() or default in (None, False, argparse.SUPPRESS, []):
            return text
        if not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


class OneLineErrorParser(argparse.ArgumentParser):
    """Refusals in one line, ``aioserve: error: ...`` (argparse prints the whole usage first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"aioserve: error: {message} (see '{self.prog} --help')\n")


def _use_formatter(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = DefaultsHelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _use_formatter(sub)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one sub-parser per command module."""
    parser = OneLineErrorParser(prog="aioserve", description="asyncio LLM serving engine")
    parser.add_argument("--version", action="version", version=f"aioserve {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        module = importlib.import_module(name)
        sub = module.add_parser(subparsers)
        sub.set_defaults(handler=module.run)
    _use_formatter(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``aioserve`` console script; returns the exit status."""
    if (sys.argv[1:] if argv is None else argv) == ["--version"]:
        print(f"aioserve {__version__}")  # at once: no command module imported
        return 0
    args = build_parser().parse_args(argv)
    try:
        status = int(args.handler(args) or 0)
    except ValueError as exc:
        print(f"aioserve: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # e.g. a --model path that does not exist
        model = getattr(args, "model", None)
        print(f"aioserve: error: cannot load {model or 'a file'}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    if argv is None and getattr(args, "exit_when_done", False):
        exit_now(status)
    return status


def exit_now(status: int) -> NoReturn:
    """End the console command's process at once, its output flushed: after a server has
    stopped nothing is left to do, and the interpreter's teardown of torch and transformers
    (1-6 s) would only delay the exit a supervisor waits for."""
    logging.getLogger("aioserve").info("exiting (status %d)", status)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    sys.exit(main())
