"""The policy comparison report (``simulate --compare``): text tables, plots, an HTML page."""

from __future__ import annotations

import base64
import contextlib
import io
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

#: (key, column header with its unit, scale, digits) of the main table.
COLUMNS = (
    ("throughput_tok_s", "output tok/s", 1.0, 1), ("goodput_req_s", "goodput req/s", 1.0, 2),
    ("slo_attainment", "SLO %", 100.0, 1), ("mean_ttft_s", "TTFT mean (s)", 1.0, 3),
    ("p50_ttft_s", "TTFT p50 (s)", 1.0, 3),
    ("p99_ttft_s", "TTFT p99 (s)", 1.0, 3), ("mean_tpot_s", "TPOT mean (ms)", 1e3, 1),
    ("p50_e2e_s", "E2E p50 (s)", 1.0, 3), ("p99_e2e_s", "E2E p99 (s)", 1.0, 3),
    ("jain_index", "Jain", 1.0, 3), ("jain_window", "Jain window (steps)", 1.0, 0),
    ("max_wait_s", "max wait (s)", 1.0, 2),
    ("preemptions", "preemptions", 1.0, 0), ("recomputed_tokens", "recomputed tok", 1.0, 0),
    ("prefix_hit_rate", "prefix hit %", 100.0, 1),
    ("prediction_tau", "length tau", 1.0, 2), ("prediction_mae", "length MAE (tokens)", 1.0, 1),
)

#: The text table's columns, the answer first (every column: ``--json`` and ``--report``).
TEXT_COLUMNS = (
    ("goodput_req_s", "goodput/s", 1.0, 2), ("slo_attainment", "SLO %", 100.0, 1),
    ("p50_ttft_s", "TTFT p50", 1.0, 3), ("p99_ttft_s", "TTFT p99", 1.0, 3),
    ("mean_tpot_s", "TPOT ms", 1e3, 1), ("p99_e2e_s", "E2E p99", 1.0, 3),
    ("throughput_tok_s", "tok/s", 1.0, 1), ("jain_index", "Jain", 1.0, 3),
    ("preemptions", "preempt", 1.0, 0),
)
#: What the text table's units are.
TEXT_UNITS = ("goodput: requests/s meeting their SLO; TTFT, E2E in s; tok/s: output tokens/s "
              "(every figure: --json or --report)")

#: The header of a per-tenant or per-priority cell.
GROUP_CELL = "mean TTFT (s) / p99 TTFT (s) / requests"


@dataclass(frozen=True)
class Table:
    """One table: a title, headers (units included), rows whose first cell names a policy."""

    title: str
    headers: list[str]
    rows: list[list[str]]


def cell(value: Any, scale: float = 1.0, digits: int = 2) -> str:
    """A table cell: text as it is, a number times ``scale`` to ``digits`` places, None "-"."""
    if isinstance(value, str):
        return value
    return "-" if value is None else f"{value * scale:.{digits}f}"


def comparison_tables(runs: list[dict[str, Any]], text: bool = False) -> list[Table]:
    """The policies' figures (``text``: the columns of :data:`TEXT_COLUMNS`, which fit 100
    columns), then TTFT per tenant and per priority where there are several."""
    columns = TEXT_COLUMNS if text else COLUMNS
    tables = [Table("policies", ["policy", *(h for _, h, _, _ in columns)],
                    [[r["scheduler"], *(cell(r.get(k), s, d) for k, _, s, d in columns)]
                     for r in runs])]
    for group, title in (("tenants", "per tenant"), ("priorities", "per priority")):
        names = sorted({name for run in runs for name in run[group]})
        if len(names) < 2:
            continue
        rows = []
        for run in runs:
            cells = []
            for name in names:
                row = run[group].get(name)
                cells.append("-" if row is None else
                             f"{cell(row['mean_ttft_s'], 1, 3)} / "
                             f"{cell(row['p99_ttft_s'], 1, 3)} / {row['requests']}")
            rows.append([run["scheduler"], *cells])
        tables.append(Table(f"{title}: {GROUP_CELL}", ["policy", *names], rows))
    return tables


def format_table(table: Table) -> str:
    widths = [max(len(str(c)) for c in column) for column in zip(table.headers, *table.rows)]
    lines = []
    for index, row in enumerate([table.headers, *table.rows]):
        lines.append(f"{row[0]:<{widths[0]}}" + "".join(
            f"  {cell:>{width}}" for cell, width in zip(row[1:], widths[1:])))
        if index == 0:
            lines.append("-" * len(lines[0]))
    return "\n".join(lines)


def table_notes(runs: list[dict[str, Any]]) -> list[str]:
    """What the main table's cells mean where a run needs it said."""
    notes = []
    for run in runs:
        if run.get("jain_weights"):
            weights = ", ".join(f"{t}={w:g}" for t, w in run["jain_weights"].items())
            notes.append(f"{run['scheduler']}: Jain's index of service / weight ({weights})")
    for run in runs:
        if run.get("jain_window"):
            notes.append(f"{run['scheduler']}: Jain over {run['jain_window']} steps (those "
                         "where every tenant had a request waiting / all)")
    if any(run.get("prediction_tau") is not None for run in runs):
        notes.append("length tau, MAE: the policy's predicted output lengths at arrival "
                     "against the true ones (Kendall's tau-b of the orders)")
    if any(run.get("slo_attainment") is None for run in runs):
        notes.append("SLO %: - where no request carries an objective (--slo-ttft-ms sets one)")
    return notes


def format_comparison(runs: list[dict[str, Any]], title: str = "") -> str:
    blocks = [textwrap.fill(line, 100, subsequent_indent="  ")
              for line in title.splitlines()] if title else []
    for index, table in enumerate(comparison_tables(runs, text=True)):
        blocks.append(format_table(table) if index == 0
                      else f"\n{table.title}\n{format_table(table)}")
        if index == 0:
            blocks.extend(textwrap.fill(note, 100, subsequent_indent="  ")
                          for note in [TEXT_UNITS, *table_notes(runs)])
    return "\n".join(blocks)


def comparison_figure(runs: list[dict[str, Any]], title: str = "") -> Any:
    """Throughput, goodput, TTFT p50/p99 and per-tenant TTFT and service share, axes from
    zero (ValueError when matplotlib is missing)."""
    plt = pyplot()
    names = [r["scheduler"] for r in runs]
    tenants = sorted({t for r in runs for t in r["tenants"]})
    panels = 4 if len(tenants) > 1 else 2
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4))
    axes[0].bar(names, [r["throughput_tok_s"] for r in runs], color="#4fb3ff")
    axes[0].set_ylabel("output tokens/s (bars)")
    axes[0].set_title("throughput and goodput")
    twin = axes[0].twinx()
    twin.plot(names, [r["goodput_req_s"] for r in runs], "o", color="#e4572e")
    twin.set_ylabel("goodput req/s (dots)")
    twin.set_ylim(bottom=0, top=max([r["goodput_req_s"] for r in runs] + [0]) * 1.1 or 1)
    for key, style in (("p50_ttft_s", "s-"), ("p99_ttft_s", "^--")):
        axes[1].plot(names, [r[key] or 0 for r in runs], style, label=key[:3])
    axes[1].set_title("TTFT")
    axes[1].set_ylabel("TTFT (s)")
    axes[1].legend(["p50", "p99"])
    if panels == 4:
        width = 0.8 / len(tenants)
        for index, tenant in enumerate(tenants):
            ttfts = [r["tenants"].get(tenant, {}).get("mean_ttft_s") or 0 for r in runs]
            axes[2].bar([i + (index - (len(tenants) - 1) / 2) * width
                         for i in range(len(runs))], ttfts, width, label=tenant)
        axes[2].set_xticks(range(len(runs)), names)
        axes[2].set_title("mean TTFT per tenant")
        axes[2].set_ylabel("mean TTFT (s)")
        axes[2].legend(fontsize=7)
        bottom = [0.0] * len(runs)
        for tenant in tenants:
            shares = []
            for run in runs:
                total = sum(t["backlogged_service"] for t in run["tenants"].values()) or 1.0
                shares.append(run["tenants"].get(tenant, {}).get("backlogged_service", 0)
                              / total)
            axes[3].bar(names, shares, bottom=bottom, label=tenant)
            bottom = [b + s for b, s in zip(bottom, shares)]
        axes[3].set_title("share of service while all tenants wait")
        axes[3].set_ylabel("share (0-1)")
        axes[3].set_ylim(0, 1)
        axes[3].legend(fontsize=7)
    for ax in axes:
        ax.set_ylim(bottom=0)
        ax.tick_params(axis="x", labelrotation=30)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_comparison(runs: list[dict[str, Any]], path: str | Path | None = None,
                    title: str = "") -> bytes:
    """A PNG of :func:`comparison_figure`, written to ``path`` if given."""
    return png_of(comparison_figure(runs, title), path)


def save_figure(fig: Any, path: str | Path) -> Path:
    """Write a matplotlib figure (PNG, SVG or PDF by the suffix) and close it."""
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend; ValueError naming the extra when missing."""
    try:
        import matplotlib
    except ImportError as exc:
        raise ValueError(f"plots need matplotlib: pip install 'aioserve[plots]' ({exc})") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png_of(fig: Any, path: str | Path | None = None) -> bytes:
    """A matplotlib figure as PNG bytes (closed after), written to ``path`` if given."""
    import matplotlib.pyplot as plt

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
img{max-width:100%;background:#fff;border-radius:6px}h1{font-size:20px}h2{font-size:16px}
</style></head>
<body><h1>{{ title }}</h1><p>{{ note }}</p>
{% for table in tables %}<section><h2>{{ table.title }}</h2>
<table><tr>{% for h in table.headers %}<th>{{ h }}</th>{% endfor %}</tr>
{% for row in table.rows %}<tr>{% for v in row %}<td>{{ v }}</td>{% endfor %}</tr>
{% endfor %}</table></section>
{% endfor %}
{% if png %}<section><h2>plots</h2>
<img alt="plots" src="data:image/png;base64,{{ png }}"></section>{% endif %}
{% for heading, image in more %}<section><h2>{{ heading }}</h2>
<img alt="{{ heading }}" src="data:image/png;base64,{{ image }}"></section>{% endfor %}
</body></html>""", autoescape=True)


def write_comparison_html(runs: list[dict[str, Any]], path: str | Path, title: str,
                          note: str = "", tables: list[Table] | None = None,
                          more: dict[str, Callable[[], bytes]] | None = None) -> Path:
    """A self-contained HTML report: each table once in its own section (the comparison's,
    then ``tables``), then the plots (the comparison's, then each of ``more``: heading ->
    PNG maker)."""
    return write_page(path, title, note, comparison_tables(runs) + (tables or []),
                      lambda: plot_comparison(runs), more)


def write_page(path: str | Path, title: str, note: str, tables: list[Table],
               plot: Callable[[], bytes],
               more: dict[str, Callable[[], bytes]] | None = None) -> Path:
    """The report page: ``tables`` each in a section, then ``plot()``'s PNG and each of
    ``more``'s (each left out when matplotlib is missing: its maker raises ValueError)."""
    images = []
    for heading, maker in {"": plot, **(more or {})}.items():
        with contextlib.suppress(ValueError):
            images.append((heading, base64.b64encode(maker()).decode("ascii")))
    png = images.pop(0)[1] if images and images[0][0] == "" else ""
    path = Path(path)
    path.write_text(_PAGE.render(title=title, note=note, tables=tables, png=png, more=images),
                    encoding="utf-8")
    return path
