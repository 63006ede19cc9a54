"""The attention backends by name; none (nor torch) is imported until asked."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from aioserve.runners.attention.backend import AttentionBackend
    from aioserve.runners.batch_invariance import BatchInvariance

__all__ = ["BackendEntry", "FORWARDS", "backend_for", "backend_names", "backend_serves",
           "check_forward", "register_backend"]

#: ``factory(device, invariance)``: a backend for the device under the policy.
Factory = Callable[["torch.device", "BatchInvariance"], "AttentionBackend"]

#: The model forwards (``EngineConfig.forward``): transformers' own and the lean
#: Llama forward (:mod:`~aioserve.runners.model.lean_llama`).
FORWARDS = ("transformers", "lean-llama")


@dataclass(frozen=True)
class BackendEntry:
    """One backend: its ``factory``, the ``forwards`` it serves, ``reason`` for the others."""

    factory: Factory
    forwards: tuple[str, ...] = FORWARDS
    reason: str = ""


_BACKENDS: dict[str, BackendEntry] = {}


def register_backend(
    name: str, factory: Factory,
    forwards: tuple[str, ...] = FORWARDS, reason: str = "",
) -> None:
    """Make ``name`` an ``--attention-backend``; ValueError when taken or a forward is unknown."""
    if name in _BACKENDS:
        raise ValueError(f"attention backend {name!r} is already registered")
    unknown = [f for f in forwards if f not in FORWARDS]
    if unknown:
        raise ValueError(f"attention backend {name!r}: unknown forwards {unknown}")
    _BACKENDS[name] = BackendEntry(factory, tuple(forwards), reason)


def backend_names() -> tuple[str, ...]:
    return tuple(_BACKENDS)


def _entry(name: str) -> BackendEntry:
    entry = _BACKENDS.get(name)
    if entry is None:
        raise ValueError(f"attention backend: {name!r} is not one of {', '.join(_BACKENDS)}")
    return entry


def backend_serves(name: str, forward: str) -> bool:
    """Whether backend ``name`` serves ``forward``; ValueError for an unknown backend."""
    return forward in _entry(name).forwards


def check_forward(forward: str, name: str) -> None:
    """Refuse a forward backend ``name`` does not serve (ValueError naming both options)."""
    entry = _entry(name)
    if forward != "auto" and forward not in entry.forwards:
        served = ", ".join(entry.forwards) or "none"
        raise ValueError(f"--forward {forward} cannot run with --attention-backend {name}: "
                         f"it serves --forward {served}. {entry.reason}".rstrip())


def backend_for(
    name: str, device: torch.device, forward: str = "transformers",
    invariance: BatchInvariance | None = None,
) -> AttentionBackend:
    """The backend ``name`` for ``device`` and ``forward``; ValueError where it cannot be."""
    check_forward(forward, name)
    if invariance is None:
        from aioserve.runners.batch_invariance import BatchInvariance

        invariance = BatchInvariance()
    return _entry(name).factory(device, invariance)


def _reference(device: torch.device, invariance: BatchInvariance) -> AttentionBackend:
    from aioserve.runners.attention.reference import ReferenceBackend

    return ReferenceBackend(invariance)


def _flex(device: torch.device, invariance: BatchInvariance) -> AttentionBackend:
    # the policy's context floor is the reference backend's; flex promises no
    # batch invariance of its own (row padding, in the runner, still applies)
    from aioserve.runners.attention.flex.backend import FlexBackend

    return FlexBackend.for_device(device)


register_backend("reference", _reference)
register_backend("flex", _flex)
