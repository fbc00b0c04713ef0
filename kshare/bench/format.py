"""How ``kshare bench`` writes figures: numbers, ratios, sizes, markdown tables and bar plots, shared by
the scenarios' sections of ``results.md`` (:mod:`kshare.bench.report`) and their plots."""

from __future__ import annotations

import math
from typing import Any

COLORS = {
    "direct": "tab:gray",
    "classic": "tab:gray",
    "relay": "tab:orange",
    "kshare": "tab:blue",
    "native": "tab:green",
    "kafka": "tab:red",
    "kshare-watch20": "tab:cyan",  # the spark scenario's kshare source with its commit watch at 20 ms
    "confluent": "tab:gray",  # the aioconsumer scenario's clients
    "aio": "tab:blue",
    "aio-uvloop": "tab:purple",
}


def fmt_num(x: Any, digits: int = 0) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:,.{digits}f}"


def fmt_ratio(x: Any) -> str:
    return fmt_num(x, 2)


def fmt_size(b: int) -> str:
    return "1 KiB" if b == 1024 else f"{b} B"


def fmt_pct(x: Any) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{100 * x:.0f}%"


def fmt_records(records: Any) -> str:
    """``{100: 2000000, 1024: 1000000}`` as ``2,000,000 x 100 B, 1,000,000 x 1 KiB``."""
    if isinstance(records, dict):
        return ", ".join(f"{int(v):,} x {fmt_size(int(k))}" for k, v in records.items())
    return str(records)


def table(columns: list[str], rows: list[list[str]], align: str | None = None) -> list[str]:
    """A markdown table; ``align`` one letter per column, ``l`` or ``r`` (default: the first left)."""
    align = align or "l" + "r" * (len(columns) - 1)
    sep = ["---:" if a == "r" else "---" for a in align]
    return ["| " + " | ".join(columns) + " |", "| " + " | ".join(sep) + " |"] + [
        "| " + " | ".join(r) + " |" for r in rows
    ]


def bars(ax: Any, groups: list[str], series: dict[str, list[float]], ylabel: str) -> None:
    """Grouped bars on a matplotlib axis: one group per label of ``groups``, one bar per series."""
    n = len(series)
    width = 0.8 / max(n, 1)
    for i, (label, values) in enumerate(series.items()):
        xs = [g + (i - (n - 1) / 2) * width for g in range(len(groups))]
        ax.bar(
            xs,
            [0 if v is None or (isinstance(v, float) and math.isnan(v)) else v for v in values],
            width,
            label=label,
            color=COLORS.get(label),
        )
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, fontsize=8)
    bar_axis(ax, ylabel)


def line_axis(ax: Any, xlabel: str, ylabel: str, title: str, legend_size: int = 8) -> None:
    """A line plot's axis (scales set by the caller): its labels, the title in small print, a light grid at
    the minor ticks too (log scales), the legend."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=legend_size)


def bar_axis(ax: Any, ylabel: str) -> None:
    """The y axis of a bar plot: its label, a light grid along it, the legend in small print."""
    ax.set_ylabel(ylabel)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)


def log_label(y: float, _: Any = None) -> str:
    """A log axis' tick as a plain number, at 1, 2 and 5 times a power of ten only."""
    if y <= 0:
        return ""
    mantissa = y / 10 ** math.floor(math.log10(y) + 1e-9)
    return f"{y:g}" if any(abs(mantissa - m) < 1e-6 for m in (1, 2, 5)) else ""
