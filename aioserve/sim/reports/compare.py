"""The policy comparison report (``aioserve simulate --compare``): a text table, plots
and a self-contained HTML page of :func:`~aioserve.sim.reports.figures.policy_figures`."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import jinja2

#: (key, column header, scale, digits) of the main table.
COLUMNS = (
    ("throughput_tok_s", "tok/s", 1.0, 1), ("goodput_req_s", "goodput/s", 1.0, 2),
    ("slo_attainment", "SLO %", 100.0, 1), ("p50_ttft_s", "TTFT p50", 1.0, 3),
    ("p99_ttft_s", "TTFT p99", 1.0, 3), ("mean_tpot_s", "TPOT ms", 1e3, 1),
    ("p50_e2e_s", "E2E p50", 1.0, 3), ("p99_e2e_s", "E2E p99", 1.0, 3),
    ("jain_index", "Jain", 1.0, 3), ("max_wait_s", "max wait", 1.0, 2),
    ("preemptions", "preempt", 1.0, 0), ("recomputed_tokens", "recomputed", 1.0, 0),
)


def _cell(value: Any, scale: float, digits: int) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def format_comparison(runs: list[dict[str, Any]], title: str = "") -> str:
    """The figures of several policies as a text table, then per tenant and priority
    (TTFT in seconds; TPOT in milliseconds)."""
    width = max([len(r["scheduler"]) for r in runs] + [8])
    head = f"{'policy':<{width}}" + "".join(f"{h:>11}" for _, h, _, _ in COLUMNS)
    lines = [title] if title else []
    lines += [head, "-" * len(head)]
    for run in runs:
        lines.append(f"{run['scheduler']:<{width}}" + "".join(
            f"{_cell(run.get(k), s, d):>11}" for k, _, s, d in COLUMNS))
    for group in ("tenants", "priorities"):
        names = sorted({name for run in runs for name in run[group]})
        if len(names) < 2:
            continue
        lines += ["", f"per {group[:-3] + 'y' if group == 'priorities' else 'tenant'}: "
                  "mean TTFT s / p99 TTFT s / requests"]
        lines.append(f"{'policy':<{width}}" + "".join(f"{n:>24}" for n in names))
        for run in runs:
            cells = []
            for name in names:
                row = run[group].get(name)
                cells.append("-" if row is None else
                             f"{_cell(row['mean_ttft_s'], 1, 3)} / "
                             f"{_cell(row['p99_ttft_s'], 1, 3)} / {row['requests']}")
            lines.append(f"{run['scheduler']:<{width}}" + "".join(f"{c:>24}" for c in cells))
    return "\n".join(lines)


def plot_comparison(runs: list[dict[str, Any]], path: str | Path | None = None) -> bytes:
    """A PNG: throughput and goodput per policy, TTFT p50/p99 per policy, and each
    tenant's share of the backlogged service per policy. Written to ``path`` if given.

    Raises:
        ValueError: matplotlib is missing (``pip install 'aioserve[plots]'``).
    """
    try:
        import matplotlib
    except ImportError as exc:
        raise ValueError(f"plots need matplotlib: pip install 'aioserve[plots]' ({exc})") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["scheduler"] for r in runs]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    axes[0].bar(names, [r["throughput_tok_s"] for r in runs], color="#4fb3ff")
    axes[0].set_title("output tokens/s (bars), goodput req/s (dots)")
    twin = axes[0].twinx()
    twin.plot(names, [r["goodput_req_s"] for r in runs], "o", color="#e4572e")
    for key, style in (("p50_ttft_s", "s-"), ("p99_ttft_s", "^--")):
        axes[1].plot(names, [r[key] or 0 for r in runs], style, label=key[:3])
    axes[1].set_title("TTFT (s)")
    axes[1].legend(["p50", "p99"])
    tenants = sorted({t for r in runs for t in r["tenants"]})
    bottom = [0.0] * len(runs)
    for tenant in tenants:
        shares = []
        for run in runs:
            total = sum(t["backlogged_service"] for t in run["tenants"].values()) or 1.0
            shares.append(run["tenants"].get(tenant, {}).get("backlogged_service", 0) / total)
        axes[2].bar(names, shares, bottom=bottom, label=tenant)
        bottom = [b + s for b, s in zip(bottom, shares)]
    axes[2].set_title("share of service while all tenants wait")
    axes[2].legend(fontsize=7)
    for ax in axes:
        ax.tick_params(axis="x", labelrotation=30)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    plt.close(fig)
    if path is not None:
        Path(path).write_bytes(buffer.getvalue())
    return buffer.getvalue()


_PAGE = jinja2.Template("""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{{ title }}</title>
<style>body{font:14px system-ui,sans-serif;background:#0f1419;color:#d8dee4;margin:24px}
table{border-collapse:collapse;margin:12px 0}td,th{padding:4px 10px;border-bottom:1px solid #2a323c;
text-align:right}th:first-child,td:first-child{text-align:left}th{color:#8b98a5}
img{max-width:100%;background:#fff;border-radius:6px}h1{font-size:20px}</style></head>
<body><h1>{{ title }}</h1><p>{{ note }}</p>
<table><tr><th>policy</th>{% for c in columns %}<th>{{ c[1] }}</th>{% endfor %}</tr>
{% for r in rows %}<tr><td>{{ r.name }}</td>{% for v in r.cells %}<td>{{ v }}</td>{% endfor %}
</tr>{% endfor %}</table>
<pre>{{ text }}</pre>
{% if png %}<img alt="comparison plots" src="data:image/png;base64,{{ png }}">{% endif %}
</body></html>""", autoescape=True)


def write_comparison_html(runs: list[dict[str, Any]], path: str | Path, title: str,
                          note: str = "") -> Path:
    """A self-contained HTML report (table, per-tenant and per-priority figures, the
    plots inline).

    Raises:
        OSError: the file cannot be written.
    """
    rows = [{"name": r["scheduler"],
             "cells": [_cell(r.get(k), s, d) for k, _, s, d in COLUMNS]} for r in runs]
    try:
        png = base64.b64encode(plot_comparison(runs)).decode("ascii")
    except ValueError:  # no matplotlib: the page without its plots
        png = ""
    page = _PAGE.render(title=title, note=note, columns=COLUMNS, rows=rows,
                        text=format_comparison(runs), png=png)
    path = Path(path)
    path.write_text(page, encoding="utf-8")
    return path
