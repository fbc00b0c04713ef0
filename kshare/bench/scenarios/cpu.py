"""The ``cpu`` scenario of ``kshare bench``: Proxy CPU per MB/s delivered."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..format import COLORS, bar_axis, fmt_num, fmt_size, table
from . import passthrough, share
from .common import scenario, target

if TYPE_CHECKING:
    from ..runner import Env, Progress

CPU_TARGET = 35.0  # proxy millicores per MB/s

SIZES = ({"records": {100: 300_000, 1024: 150_000}}, {"records": {100: 50_000, 1024: 20_000}})


def run(
    env: Env, progress: Progress, *, earlier: dict[str, Any], records: dict[int, int], repeats: int
) -> dict[str, Any]:
    """Millicores of the proxy process per MB/s of record values it delivered (= CPU ms per MB), from
    the pass-through and share scenarios of this run, or measured here (kshare only) if they did not run."""
    rows = []
    pt = earlier.get("passthrough")
    if pt is None:
        pt = passthrough.run(env, progress, records=records, repeats=repeats, configs=["kshare"], warmup=False)
    for r in pt["rows"]:
        if "kshare_mcores_per_mbps" in r:
            rows.append(
                {
                    "workload": f"pass-through {r['workload']}",
                    "value_size": r["value_size"],
                    "mbps": r["kshare_mbps"],
                    "cpu_s": r["kshare_cpu_s"],
                    "mcores_per_mbps": r["kshare_mcores_per_mbps"],
                }
            )
    sh = earlier.get("share")
    if sh is None:
        sh = share.run(
            env,
            progress,
            records=records,
            partition_counts=[4],
            repeats=repeats,
            configs=["kshare"],
            warmup=0,
        )
    for r in sh["rows"]:
        mb = r["records"] * r["value_size"] / 1e6
        rows.append(
            {
                "workload": f"share consumer, {r['partitions']} partition(s)",
                "value_size": r["value_size"],
                "mbps": r["kshare_rps"] * r["value_size"] / 1e6,
                "cpu_s": r["kshare_cpu_s"],
                "mcores_per_mbps": r["kshare_cpu_s"] * 1000 / mb,
            }
        )
    targets = [
        target(
            f"proxy CPU, {r['workload']} {fmt_size(r['value_size'])} (millicores per MB/s)",
            r["mcores_per_mbps"],
            CPU_TARGET,
            "<=",
            "mcores/(MB/s)",
        )
        for r in rows
    ]
    return {
        "config": {
            "source": "this run's passthrough and share scenarios"
            if "passthrough" in earlier and "share" in earlier
            else "measured here"
        },
        "rows": rows,
        "samples": [],
        "targets": targets,
    }


# -- results.md and the plot ----------------------------------------------------------------------


def section(res: dict[str, Any]) -> list[str]:
    rows = [
        [
            r["workload"],
            fmt_size(r["value_size"]),
            fmt_num(r["mbps"], 1),
            fmt_num(r["cpu_s"], 2),
            fmt_num(r["mcores_per_mbps"], 1),
        ]
        for r in res.get("rows", [])
    ]
    text = [
        "CPU time of the proxy process (utime + stime from /proc) per MB of record values delivered, i.e. "
        "millicores per MB/s (" + res.get("config", {}).get("source", "") + ").",
        "",
    ]
    return (
        text
        + table(["workload", "value", "MB/s", "proxy CPU s", "millicores per MB/s"], rows, "llrrr")
        + [""]
    )


def plot(plt: Any, res: dict[str, Any]) -> Any:
    rows = res["rows"]
    fig, ax = plt.subplots(figsize=(8, 4))
    labels = [f"{r['workload']}\n{fmt_size(r['value_size'])}" for r in rows]
    ax.bar(range(len(rows)), [r["mcores_per_mbps"] for r in rows], color=COLORS["kshare"])
    ax.axhline(35, color="tab:red", ls=":", lw=1, label="target 35")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, fontsize=7)
    bar_axis(ax, "millicores per MB/s")
    return fig


SCENARIO = scenario(
    __name__, 'Proxy CPU per MB/s delivered',
    uses_earlier=True,
)
