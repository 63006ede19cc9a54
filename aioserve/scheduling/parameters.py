"""A policy's parameters (``--scheduler-config``'s keys), described by its ``Args:`` section."""

from __future__ import annotations

import inspect
import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["REQUIRED", "PolicyParameter", "configuration_text", "policy_configuration",
           "policy_parameters"]

#: The default of a parameter that has none.
REQUIRED: Any = inspect.Parameter.empty

_ARG = re.compile(r"^(\s*)([A-Za-z_][\w, ]*):\s*(.*)$")


@dataclass(frozen=True)
class PolicyParameter:
    """One constructor parameter: keyword, annotation, default (or REQUIRED), description."""

    name: str
    type: str
    default: Any
    description: str


def _arg_descriptions(doc: str | None) -> dict[str, str]:
    """``name -> text`` from a Google-style ``Args:`` section (``a, b: text`` names two)."""
    descriptions: dict[str, str] = {}
    lines = inspect.cleandoc(doc or "").splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Args:")
    except StopIteration:
        return descriptions
    names: list[str] = []
    entry_indent: int | None = None
    for line in lines[start + 1:]:
        if not line.strip():
            if names:
                continue
            break
        indent = len(line) - len(line.lstrip())
        if indent == 0:
            break  # the next section (Raises:, Attributes:)
        match = _ARG.match(line)
        if match and (entry_indent is None or indent <= entry_indent):
            entry_indent = indent
            names = [n.strip() for n in match.group(2).split(",") if n.strip()]
            for name in names:
                descriptions[name] = match.group(3).strip()
        elif names:
            for name in names:
                descriptions[name] = f"{descriptions[name]} {line.strip()}".strip()
    return descriptions


def _type_text(annotation: Any) -> str:
    if annotation is inspect.Parameter.empty:
        return ""
    if isinstance(annotation, str):
        return annotation
    return getattr(annotation, "__name__", None) or str(annotation)


def keyword_parameters(cls: Any) -> list[inspect.Parameter]:
    """The parameters ``cls``'s constructor takes by keyword, in signature order."""
    return [p for p in inspect.signature(cls).parameters.values()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def policy_parameters(cls: type) -> list[PolicyParameter]:
    """Those parameters with their types, defaults and descriptions."""
    descriptions: dict[str, str] = {}
    for klass in reversed(cls.__mro__):  # a subclass's description wins
        descriptions.update(_arg_descriptions(klass.__doc__))
    return [
        PolicyParameter(p.name, _type_text(p.annotation), p.default,
                        descriptions.get(p.name, ""))
        for p in keyword_parameters(cls)
    ]


def policy_configuration(scheduler: object, params: dict[str, Any] | None) -> dict[str, Any]:
    """Every parameter of ``scheduler``'s class with its value: ``params`` where given, else
    the policy's plain attribute of that name, else the default."""
    given = params or {}
    values: dict[str, Any] = {}
    for p in policy_parameters(type(scheduler)):
        held = getattr(scheduler, p.name, REQUIRED)
        if p.name in given:
            values[p.name] = given[p.name]
        elif held is None or isinstance(held, bool | int | float | str):
            values[p.name] = held
        elif p.default is not REQUIRED:
            values[p.name] = p.default
    return values


def configuration_text(values: dict[str, Any]) -> str:
    return json.dumps(values, default=repr)
