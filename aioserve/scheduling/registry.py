"""Find scheduling policies by name or ``"package.module:Class"`` and make them, checked."""

from __future__ import annotations

import difflib
import importlib
import inspect
import json
import typing
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

import pydantic

from aioserve.scheduling.parameters import keyword_parameters
from aioserve.scheduling.policy import Scheduler

ENTRY_POINT_GROUP = "aioserve.schedulers"


def available_schedulers() -> list[str]:
    return sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))


def load_object(spec: str) -> Any:
    """The object a ``"package.module:attribute"`` names (a ValueError says why not)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{spec!r} is not of the form 'package.module:Name'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{spec!r}: cannot import {module_name!r}: {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ValueError(f"{spec!r}: {module_name!r} has no {attr!r}") from None


def load_class(spec: str, group: str, kind: str,
               builtins: Mapping[str, str] | None = None) -> Any:
    """The class a plugin spec names: ``"package.module:Class"``, a built-in name (mapped to
    such a spec) or an entry point of ``group``; a ValueError names the ``kind`` and lists
    the registered names."""
    if ":" in spec:
        return load_object(spec)
    if builtins and spec in builtins:
        return load_object(builtins[spec])
    matches = [ep for ep in entry_points(group=group) if ep.name == spec]
    if not matches:
        names = sorted({*(builtins or {}), *(ep.name for ep in entry_points(group=group))})
        known = ", ".join(names) or "none (is aioserve installed?)"
        raise ValueError(
            f"unknown {kind} {spec!r}; registered: {known}; or use 'package.module:Class'"
        )
    return matches[0].load()


def _load_class(spec: str) -> Any:
    return load_class(spec, ENTRY_POINT_GROUP, "scheduler")


def scheduler_name(spec: str) -> str:
    """The ``name`` of the policy a spec loads (the spec itself when there is none)."""
    try:
        name = getattr(_load_class(spec), "name", "")
    except ValueError:
        return spec
    return name if isinstance(name, str) and name else spec


def parameter_names(spec: str) -> list[str]:
    """The constructor parameters of the policy a spec loads (none when it cannot load)."""
    try:
        return [p.name for p in keyword_parameters(_load_class(spec))]
    except (ValueError, TypeError):
        return []


def _check_shared(specs: list[str], params: Mapping[str, Any]) -> None:
    """One object of parameters for several policies: a ValueError when one of them lacks a
    key, showing the keyed form."""
    for spec in specs:
        try:
            signature = inspect.signature(_load_class(spec))
        except (ValueError, TypeError):
            continue  # the load reports it
        if any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
            continue
        missing = [key for key in params if key not in signature.parameters]
        if missing:
            owner = next((other for other in specs if missing[0] in parameter_names(other)),
                         specs[0])
            raise ValueError(
                f"--scheduler-config: {spec!r} has no parameter {missing[0]!r}, and one object "
                f"applies to every policy of this run ({', '.join(specs)}); key it by policy: "
                f"{json.dumps({owner: {missing[0]: params[missing[0]]}}, default=repr)}")


def params_by_policy(specs: list[str], params: Mapping[str, Any] | None
                     ) -> dict[str, dict[str, Any] | None]:
    """Each policy's parameters from one ``--scheduler-config`` object: the object for every
    policy, or keyed by policy (spec or ``name``). With several policies, a key that names
    none of them and no parameter of any, or one object that a policy lacks a key of, is a
    ValueError saying how to write it."""
    if params and all(isinstance(v, dict) for v in params.values()):
        aliases = {alias: spec for spec in specs for alias in (spec, scheduler_name(spec))}
        if set(params) <= set(aliases):
            keyed: dict[str, dict[str, Any] | None] = dict.fromkeys(specs)
            for key, value in params.items():
                keyed[aliases[key]] = value
            return keyed
        taken = {name for spec in specs for name in parameter_names(spec)}
        if len(specs) > 1 and not set(params) <= taken:
            unknown = sorted(set(params) - set(aliases))
            close = difflib.get_close_matches(unknown[0], list(aliases), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"--scheduler-config: {unknown[0]!r} names none of the policies "
                             f"of this run ({', '.join(specs)}){hint} Key it by a policy's "
                             "spec or name, or give one object of parameters for every policy")
    if params and len(specs) > 1:
        _check_shared(specs, params)
    return dict.fromkeys(specs, dict(params) if params else None)


def check_parameters(spec: str, cls: Any, params: Mapping[str, Any],
                     kind: str = "scheduler") -> dict[str, Any]:
    """``params`` checked against ``cls``'s constructor: its names and annotated types,
    strictly (``"yes"`` is no bool, ``"3"`` no int; an int is a float), a ValueError naming
    the ``kind``, the spec and the parameter."""
    names = [p.name for p in keyword_parameters(cls)]
    takes_any = any(p.kind is p.VAR_KEYWORD for p in inspect.signature(cls).parameters.values())
    try:
        hints = typing.get_type_hints(cls.__init__)
    except Exception:  # unresolvable annotations: the constructor checks for itself
        hints = {}
    checked: dict[str, Any] = {}
    for name, value in params.items():
        if name not in names and not takes_any:
            takes = ", ".join(names) or "no parameters"
            raise ValueError(f"{kind} {spec!r} has no parameter {name!r} (it takes: {takes})")
        hint = hints.get(name)
        if hint is None:
            checked[name] = value
            continue
        try:
            adapter = pydantic.TypeAdapter(hint, config={"arbitrary_types_allowed": True})
        except Exception:  # a type pydantic cannot check (a Protocol...): the policy checks
            checked[name] = value
            continue
        try:
            checked[name] = adapter.validate_python(value, strict=True)
        except pydantic.ValidationError as exc:
            reason = exc.errors()[0]["msg"]
            raise ValueError(f"{kind} {spec!r}: parameter {name!r}: {reason}, "
                             f"got {value!r}") from None
    return checked


def load_scheduler(spec: str | Scheduler, params: Mapping[str, Any] | None = None) -> Scheduler:
    """A policy instance for a name, a ``"package.module:Class"`` or an instance.

    Args:
        spec: the policy.
        params: constructor parameters (``--scheduler-config``); not with an instance.

    Raises:
        ValueError: unknown name, unimportable module, not a scheduler, a parameter
            unknown or of the wrong type, or a value the constructor refuses (named)."""
    if not isinstance(spec, str):
        if params:
            raise ValueError("scheduler parameters need a scheduler name, not an instance")
        if not isinstance(spec, Scheduler):
            raise ValueError(f"scheduler {spec!r} is not a Scheduler (aioserve.scheduling)")
        return spec
    cls = _load_class(spec)
    if not (isinstance(cls, type) and issubclass(cls, Scheduler)):
        raise ValueError(f"scheduler {spec!r} is not a Scheduler subclass (aioserve.scheduling)")
    return instantiate(spec, cls, params, "scheduler", "schedule(state)")  # type: ignore[no-any-return]


def instantiate(spec: str, cls: Any, params: Mapping[str, Any] | None, kind: str,
                method: str) -> Any:
    """``cls(**params)``, the parameters checked first; ValueError naming the ``kind``, the
    spec and what is wrong, also when the object lacks ``method`` (e.g. ``"choose(...)"``)."""
    kwargs = check_parameters(spec, cls, params or {}, kind=kind)
    try:
        made = cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{kind} {spec!r}: {exc}") from exc
    if not callable(getattr(made, method.split("(")[0], None)):
        raise ValueError(f"{kind} {spec!r} has no {method} method")
    return made
