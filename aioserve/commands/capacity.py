"""``aioserve capacity``: the highest rate meeting an SLO attainment target (a rate sweep),
or the fewest replicas meeting it at the workload's rate; simulated, or live (``--url``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import TYPE_CHECKING

from aioserve.commands.common import check_output
from aioserve.commands.simulate_cluster import check_cluster
from aioserve.commands.simulate_options import (
    CAPACITY,
    add_options,
    refuse_foreign,
    sim_config,
    slo_title,
)

if TYPE_CHECKING:
    from aioserve.commands.common import Subparsers
    from aioserve.sim.capacity import Curve
    from aioserve.sim.step_cost import StepCostModel


def add_parser(subparsers: Subparsers) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        CAPACITY, help="the highest request rate, or the fewest replicas, meeting an SLO",
        description="Sweep the workload's rate (--sweep-rate) for each policy's SLO "
        "attainment, goodput and capacity, or search the fewest replicas (--fewest-replicas); "
        "simulated (a --profile for this machine), or live against a server (--url).")
    add_options(parser, CAPACITY)
    return parser


def check(args: argparse.Namespace) -> list[float]:
    """Every refusal, named by its flag, before any run; the rates swept (empty: a replica
    search)."""
    from aioserve.sim.capacity import parse_rates

    refuse_foreign(args, CAPACITY)
    for flag in ("--report", "--plot"):
        check_output(getattr(args, flag[2:]), flag)
    if not 0 < args.target_attainment <= 1:
        raise ValueError("--target-attainment: must be in (0, 1]")
    if (args.sweep_rate is None) == (args.fewest_replicas is None):
        raise ValueError("--sweep-rate: give --sweep-rate LO:HI[:N] (the highest rate) or "
                         "--fewest-replicas MAX (the fewest replicas), one of them")
    if args.url is not None:
        if args.sweep_rate is None:
            raise ValueError("--url: a live server is swept by rate; give --sweep-rate")
        if args.workload == "article-example":
            raise ValueError("--url: give the --workload to sweep (a trace or a named one)")
        for flag, value in (("--router", args.router), ("--report", args.report),
                            ("--scheduler", args.scheduler != "fcfs"),
                            ("--max-waiting", args.max_waiting is not None),
                            ("--max-queue-time-s", args.max_queue_time_s is not None)):
            if value:
                raise ValueError(f"{flag}: not with --url (a simulated run's option; the "
                                 "server runs its own policy and admission limit)")
    return parse_rates(args.sweep_rate) if args.sweep_rate is not None else []


def policy_names(text: str) -> list[str]:
    """``--scheduler``'s comma list; ValueError when empty or a policy repeats."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise ValueError("--scheduler: give at least one policy")
    repeated = next((name for i, name in enumerate(names) if name in names[:i]), None)
    if repeated is not None:
        raise ValueError(f"--scheduler: {repeated!r} given twice")
    return names


def _print_curves(args: argparse.Namespace, curves: list[Curve], title: str) -> None:
    from aioserve.reports.sweep import format_sweep, plot_sweep, write_sweep_html

    target = args.target_attainment
    print(format_sweep(curves, target, title))
    if args.plot:
        plot_sweep(curves, target, args.plot, title.split(";")[0])
        print(f"plot: {args.plot}", file=sys.stderr)
    if args.report:
        path = write_sweep_html(curves, target, args.report,
                                f"aioserve capacity: {args.workload}", title)
        print(f"report: {path}", file=sys.stderr)
    if args.json:
        for curve in curves:
            print(json.dumps(curve.to_dict(target)))


def _sweep(args: argparse.Namespace, names: list[str], rates: list[float]) -> int:
    """Each policy's attainment and goodput against rate, and its capacity, simulated."""
    from aioserve.commands.simulate_options import policy_params
    from aioserve.reports.sweep import simulate_sweep
    from aioserve.sim.capacity import arrivals_note

    params = policy_params(args.scheduler_config, names)
    redraw = args.arrivals == "redraw"
    curves = asyncio.run(simulate_sweep(
        args.workload, names, rates, args.sweep_repeats, lambda w: sim_config(args, w),
        args.slo_ttft_ms, args.slo_tpot_ms, params, redraw))
    title = (f"simulated: {args.workload}; {arrivals_note(args.workload, redraw)}; "
             f"{slo_title(args)}; {args.sweep_repeats} repeats")
    if args.profile:
        title += f"; profile {args.profile}"
    _print_curves(args, curves, title + limits_note(args))
    return 0


def limits_note(args: argparse.Namespace) -> str:
    """The title's note of a simulated admission limit ("" without one)."""
    limits = [f"{name} {value:g}{unit}" for name, value, unit in (
        ("max_waiting", args.max_waiting, ""), ("max_queue_time_s", args.max_queue_time_s, " s"))
        if value is not None]
    return f"; admission limit: {', '.join(limits)}" if limits else ""


def _live(args: argparse.Namespace, rates: list[float]) -> int:
    """The server's attainment curve and capacity."""
    import aiohttp

    from aioserve.bench.online.serving import AuthenticationError
    from aioserve.bench.online.sweep import live_sweep
    from aioserve.sim.capacity import arrivals_note

    api_key = os.environ.get("OPENAI_API_KEY") or os.environ.get("AIOSERVE_API_KEY")
    url = args.url.rstrip("/").removesuffix("/v1")
    profile = sim_config(args, []).cost_model  # read (and refused) before any request
    redraw = args.arrivals == "redraw"
    try:
        curve, tpots = asyncio.run(live_sweep(
            url, args.workload, rates, args.sweep_repeats, vocab_size=512,
            slo_ttft_ms=args.slo_ttft_ms, slo_tpot_ms=args.slo_tpot_ms, api_key=api_key,
            max_concurrency=args.max_concurrency, redraw=redraw))
    except AuthenticationError as exc:
        print(f"aioserve capacity: authentication failed: {exc}", file=sys.stderr)
        return 1
    except aiohttp.ClientError as exc:
        print(f"aioserve capacity: cannot reach {url}: {exc}", file=sys.stderr)
        return 1
    _print_curves(args, [curve], f"server {url}: {args.workload}; "
                  f"{arrivals_note(args.workload, redraw)}; {slo_title(args)}")
    print(speed_line(tpots, rates[0], profile))
    return 0


def speed_line(tpots: list[float], rate: float, profile: StepCostModel | None) -> str:
    """The machine's measured speed (median TPOT at the lowest rate) against the profile's
    decode step of one request: what a simulated capacity on that profile assumes."""
    from aioserve.reports.stats import percentile

    measured = percentile(tpots, 50)
    if measured is None:
        return "machine speed: no request of the lowest rate had two tokens to time"
    line = f"machine speed: median TPOT at {rate:g} req/s {measured * 1e3:.2f} ms"
    if profile is None:
        return line + " (give --profile to compare with a calibrated one)"
    step = profile.cost_ms(1, 0, 0)
    return (line + f"; the profile's decode step of one request {step:.2f} ms: this machine "
            f"runs at {step / (measured * 1e3):.2f}x the profile's speed (a simulated "
            "capacity on that profile assumes 1x)")


def _fewest(args: argparse.Namespace, names: list[str]) -> int:
    """The table of each policy x router's fewest replicas."""
    from aioserve.commands.simulate_options import load, policy_params
    from aioserve.reports.replica_search import fewest_replicas, format_replica_search

    routers, params = check_cluster(args)
    workload = load(args)
    config = sim_config(args, workload)
    policies = policy_params(args.scheduler_config, names)
    searches = [asyncio.run(fewest_replicas(
        workload, policy, router, config, args.target_attainment, args.fewest_replicas,
        args.slo_ttft_ms, args.slo_tpot_ms, params[router], policies[policy]))
        for policy in names for router in routers]
    print(format_replica_search(searches, f"simulated: {args.workload}; {slo_title(args)}"
                                + limits_note(args)))
    if args.json:
        for s in searches:
            print(json.dumps({"policy": s.policy, "router": s.router, "target": s.target,
                              "replicas": s.replicas, "tried": {
                                  str(n): {"attainment": a, "goodput_req_s": g,
                                           "refused": s.refused.get(n, 0)}
                                  for n, (a, g) in sorted(s.tried.items())}}))
    return 0


def run(args: argparse.Namespace) -> int:
    """Run ``capacity``; ValueError naming the flag of a bad option."""
    rates = check(args)
    names = policy_names(args.scheduler)
    if args.url is not None:
        return _live(args, rates)
    if args.fewest_replicas is not None:
        return _fewest(args, names)
    return _sweep(args, names, rates)
