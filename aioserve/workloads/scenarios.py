"""Bursty, seeded workloads that exercise policies (``NAME[:key=value,...]``)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aioserve.request_meta import RequestMeta
from aioserve.workloads.request import (
    MAX_REQUESTS,
    WorkloadRequest,
    article_example,
    article_mix,
    bursty_arrivals,
    poisson,
)
from aioserve.workloads.trace_options import load_file, split_spec


def two_tenants(n: int = 200, rate: float = 40.0, light: float = 0.1, burst: float = 2.0,
                seed: int = 0) -> list[WorkloadRequest]:
    """Tenant ``heavy`` sends ``1 - light`` of the requests, tenant ``light`` the rest;
    prompts 16-64 tokens, outputs 16-128."""
    rng = random.Random(seed)
    return [WorkloadRequest(f"t{i:04d}", t, rng.randint(16, 64), rng.randint(16, 128),
                            meta=RequestMeta(tenant="light" if rng.random() < light else "heavy"))
            for i, t in enumerate(bursty_arrivals(n, rate, burst, rng))]


def priority_mix(n: int = 200, rate: float = 40.0, high: float = 0.1, burst: float = 2.0,
                 seed: int = 0) -> list[WorkloadRequest]:
    """``high`` of the requests have priority 0, the others 1 (lower is served first);
    prompts 16-64 tokens, outputs 16-128."""
    rng = random.Random(seed)
    return [WorkloadRequest(f"q{i:04d}", t, rng.randint(16, 64), rng.randint(16, 128),
                            meta=RequestMeta(priority=0 if rng.random() < high else 1))
            for i, t in enumerate(bursty_arrivals(n, rate, burst, rng))]


def slo_mix(n: int = 200, rate: float = 40.0, tight_ms: float = 500.0,
            loose_ms: float = 5000.0, tpot_ms: float | None = None, burst: float = 2.0,
            seed: int = 0) -> list[WorkloadRequest]:
    """Half the requests are interactive (``ttft_slo_ms`` = ``tight_ms``, short
    outputs 8-64), half batch-like (``loose_ms``, outputs 64-192); prompts 16-128."""
    rng = random.Random(seed)
    items = []
    for i, t in enumerate(bursty_arrivals(n, rate, burst, rng)):
        tight = rng.random() < 0.5
        items.append(WorkloadRequest(
            f"s{i:04d}", t, rng.randint(16, 128),
            rng.randint(8, 64) if tight else rng.randint(64, 192),
            meta=RequestMeta(tenant="interactive" if tight else "batch",
                             ttft_slo_ms=tight_ms if tight else loose_ms, tpot_slo_ms=tpot_ms)))
    return items


def heavy_tail(n: int = 200, rate: float = 20.0, alpha: float = 1.3, burst: float = 2.0,
               seed: int = 0) -> list[WorkloadRequest]:
    """Output lengths Pareto(``alpha``) from 8 tokens, capped at 400 (most short, a few
    very long, as in chat traces); prompts lognormal around 48 tokens, 8-256."""
    rng = random.Random(seed)
    return [WorkloadRequest(f"h{i:04d}", t,
                            min(max(int(rng.lognormvariate(3.9, 0.6)), 8), 256),
                            min(int(8 * rng.paretovariate(alpha)), 400))
            for i, t in enumerate(bursty_arrivals(n, rate, burst, rng))]


#: ``routes``: name -> (share of requests, median output tokens, prompt tokens range).
ROUTES = {"classify": (0.4, 12, (64, 256)), "chat": (0.4, 96, (16, 128)),
          "summarize": (0.2, 320, (256, 768))}


def routes(n: int = 600, rate: float = 10.0, spread: float = 0.35, burst: float = 2.0,
           seed: int = 0) -> list[WorkloadRequest]:
    """Three routes named in ``metadata["route"]``, with output lengths lognormal around
    their medians (``classify`` 12, ``chat`` 96, ``summarize`` 320 tokens; ``spread`` is
    the log standard deviation) and prompts of their own ranges: lengths depend on what a
    server can observe, so a learned predictor can pay."""
    rng = random.Random(seed)
    names = list(ROUTES)
    shares = [ROUTES[name][0] for name in names]
    items = []
    for i, t in enumerate(bursty_arrivals(n, rate, burst, rng)):
        route = rng.choices(names, shares)[0]
        _, median, (low, high) = ROUTES[route]
        items.append(WorkloadRequest(
            f"r{i:04d}", t, rng.randint(low, high),
            max(1, min(round(median * rng.lognormvariate(0.0, spread)), 3 * median)),
            meta=RequestMeta(metadata={"route": route})))
    return items


def shared_prefix(n: int = 200, rate: float = 20.0, prompts: int = 4, prefix: int = 384,
                  hot: float = 0.5, burst: float = 2.0, seed: int = 0) -> list[WorkloadRequest]:
    """Each request starts with one of ``prompts`` shared prompts of ``prefix`` tokens (a
    system prompt, a document), then 16-64 tokens of its own; outputs 16-128. Prompt 0 is
    hot: ``hot`` of the requests take it, the rest spread evenly over the others."""
    if prompts < 1 or not 0 <= hot <= 1 or prefix < 0:
        raise ValueError("shared-prefix workload needs prompts >= 1, 0 <= hot <= 1, prefix >= 0")
    rng = random.Random(seed)
    items = []
    for i, t in enumerate(bursty_arrivals(n, rate, burst, rng)):
        group = 0 if prompts == 1 or rng.random() < hot else rng.randrange(1, prompts)
        items.append(WorkloadRequest(f"x{i:04d}", t, prefix + rng.randint(16, 64),
                                     rng.randint(16, 128), prefix_group=f"prompt{group}",
                                     prefix_len=prefix))
    return items


SCENARIOS: dict[str, Callable[..., list[WorkloadRequest]]] = {
    "two-tenants": two_tenants, "priority-mix": priority_mix, "slo-mix": slo_mix,
    "heavy-tail": heavy_tail, "routes": routes, "shared-prefix": shared_prefix,
}


def parse_options(name: str, text: str, allowed: tuple[str, ...]) -> dict[str, Any]:
    """``key=value,...`` as numbers, checked against ``allowed`` (a ValueError names the key)."""
    options: dict[str, Any] = {}
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        if key not in allowed:
            raise ValueError(f"{name} workload: unknown option {key!r} ({', '.join(allowed)})")
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"{name} workload: {key} must be a number, got {value!r}") from None
        whole = key in ("n", "seed", "prompts", "prefix")
        if whole and (not math.isfinite(number) or number != int(number)):
            raise ValueError(f"{name} workload: {key} must be a whole number, got {value!r}")
        if key == "n" and not 1 <= number <= MAX_REQUESTS:
            raise ValueError(f"{name} workload: n must be 1..{MAX_REQUESTS:,} requests, got "
                             f"{value!r}")
        options[key] = int(number) if whole else number
    return options


def scenario(spec: str) -> list[WorkloadRequest] | None:
    """The scenario a spec names (``two-tenants:n=100,rate=60``), or None."""
    name, _, text = spec.partition(":")
    make = SCENARIOS.get(name)
    if make is None:
        return None
    allowed = make.__code__.co_varnames[: make.__code__.co_argcount]
    return make(**parse_options(name, text, allowed))


def load_workload(spec: str) -> list[WorkloadRequest]:
    """A named workload or scenario (``NAME[:key=value,...]``), or a trace or JSON Lines
    file (``FILE[:key=value,...]``, see :mod:`aioserve.workloads.trace_options`)."""
    if spec == "article-example":
        return article_example()
    if spec == "article-mix":
        return article_mix()
    if spec == "poisson" or spec.startswith("poisson:"):
        options = parse_options("poisson", spec.partition(":")[2], ("n", "rate", "burst", "seed"))
        return poisson(**options)
    found = scenario(spec)
    if found is not None:
        return found
    path, text = (spec, "") if Path(spec).exists() else split_spec(spec)
    if not Path(path).exists():
        raise ValueError(f"workload {spec!r}: no file {path!r}, and not a named workload "
                         f"(article-example, article-mix, poisson, {', '.join(SCENARIOS)})")
    if Path(path).is_dir():
        raise ValueError(f"workload {spec!r}: {path!r} is a directory; give a trace or "
                         "workload file in it")
    return load_file(path, text)
