"""``aioserve policies``: the installed scheduling policies and their parameters, no torch."""

from __future__ import annotations

import argparse
import inspect
import json
from typing import TYPE_CHECKING

from aioserve.scheduling.parameters import REQUIRED, policy_parameters
from aioserve.scheduling.registry import ENTRY_POINT_GROUP, available_schedulers, load_object

if TYPE_CHECKING:
    from aioserve.commands.common import Subparsers


def add_parser(subparsers: Subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "policies", help="list the scheduling policies and their parameters",
        description="The scheduling policies --scheduler takes (entry points of the "
                    f"{ENTRY_POINT_GROUP!r} group) and the parameters --scheduler-config "
                    "takes, with their types and defaults.")
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help="policies to show (a name or package.module:Class; default: all)")
    return parser


def describe(spec: str) -> str:
    """One policy's name, class, summary and parameters; ValueError when not importable."""
    from importlib.metadata import entry_points

    if ":" in spec:
        target = spec
    else:
        found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == spec]
        if not found:
            known = ", ".join(available_schedulers()) or "none"
            raise ValueError(f"unknown policy {spec!r}; registered: {known}")
        target = found[0].value
    cls = load_object(target)
    paragraph = " ".join(inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0].split())
    summary = paragraph.split(". ")[0].rstrip(".")
    lines = [f"{spec}  ({target})" + (f": {summary}." if summary else "")]
    parameters = policy_parameters(cls)
    for p in parameters:
        given = p.default is not REQUIRED
        default = f"= {json.dumps(p.default, default=repr)}" if given else "required"
        typed = f": {p.type}" if p.type else ""
        lines.append(f"  {p.name}{typed} {default}" + (f"  {p.description}" if p.description
                                                        else ""))
    if not parameters:
        lines.append("  (no parameters)")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    names = args.names or available_schedulers()
    print("\n\n".join(describe(name) for name in names))
    return 0
