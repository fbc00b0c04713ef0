"""``results.md`` and the PNG plots of a ``kshare bench`` run, from its results dict (``results.json``):
the run's header, the targets and each scenario's section (written by its module in
:mod:`kshare.bench.scenarios`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .format import fmt_num, table
from .scenarios import REGISTRY


def _mark(t: dict[str, Any]) -> str:
    return "**met**" if t.get("met") else "**not met**"


def _fmt_target(t: dict[str, Any]) -> tuple[str, str]:
    value = t.get("value")
    unit = (
        f" {t['unit']}"
        if t.get("unit") and t["unit"] not in ("MB",)
        else (" MB" if t.get("unit") == "MB" else "")
    )
    digits = 0 if t.get("unit") == "MB" else 2
    return f"{fmt_num(value, digits)}{unit}", f"{t['op']} {fmt_num(t['threshold'], digits)}{unit}"


# --------------------------------------------------------------------------------------------
# markdown


def markdown(results: dict[str, Any]) -> str:
    meta = results.get("meta", {})
    machine = meta.get("machine", {})
    out = ["# kshare bench", ""]
    out.append(
        f"`{meta.get('command', 'kshare bench')}` -- started {meta.get('started', '?')}, "
        f"{fmt_num(meta.get('elapsed_s'))} s, {_repeats(meta.get('repeats'))}"
        + (" (--quick)" if meta.get("quick") else "")
        + f"; load average {meta.get('load_before', '?')} -> {meta.get('load_after', '?')}."
    )
    out.append("")
    out.append(
        f"Machine: {machine.get('nproc', '?')} CPUs ({machine.get('cpu', '?')}), Python {machine.get('python', '?')}, "
        f"confluent-kafka {machine.get('confluent_kafka', '?')} (librdkafka {machine.get('librdkafka', '?')}), "
        f"kshare {machine.get('kshare_commit', machine.get('kshare', '?'))}. Fronted cluster: {meta.get('upstream', '?')}; "
        f"reference: {meta.get('reference', '?')}."
        + (f" Proxy arguments: `{' '.join(meta['proxy_args'])}`." if meta.get("proxy_args") else "")
    )
    out.append("")
    loads = [meta.get("load_before"), meta.get("load_after")]
    peak = max((float(x.split()[0]) for x in loads if x), default=0.0)
    if machine.get("nproc") and peak > machine["nproc"]:
        out.append(
            f"**The machine was loaded** (1-minute load average up to {peak:.1f} on {machine['nproc']} CPUs): "
            "rates and latencies are noisy, tail latencies above all."
        )
        out.append("")
    out.append(
        "Every figure is a median over alternated repeats measured in this run; ratios compare "
        "configurations measured side by side, so they hold better than the absolute rates on a "
        "loaded machine."
    )
    out.append("")
    targets = [
        (name, t) for name, res in results.get("scenarios", {}).items() for t in res.get("targets", [])
    ]
    if targets:
        out += ["## Targets", ""]
        rows = []
        for _name, t in targets:
            value, threshold = _fmt_target(t)
            rows.append([t["name"], value, threshold, _mark(t)])
        out += table(["target", "measured", "target", ""], rows, "lrrl")
        met = sum(1 for _, t in targets if t.get("met"))
        out += ["", f"{met} of {len(targets)} met.", ""]
    for name, err in results.get("errors", {}).items():
        out += [f"**{name} failed**: `{err}`", ""]
    for name, res in results.get("scenarios", {}).items():
        scenario = REGISTRY.get(name)
        out += [f"## {scenario.title if scenario else name} (`{name}`)", ""]
        out += (scenario.section if scenario and scenario.section else _generic)(res)
        plots = [p for p in results.get("plots", []) if Path(p).stem.startswith(name)]
        for p in plots:
            out += [f"![{name}]({Path(p).name})", ""]
        out += [f"({fmt_num(res.get('seconds'))} s)", ""]
    left = meta.get("broker_data_left_mb")
    if left:
        out += ["Left on the brokers' disks at the end (the bench deletes its topics as it goes): "
                + ", ".join(f"Apache Kafka {v} {fmt_num(mb)} MB" for v, mb in sorted(left.items())) + ".", ""]
    notes = meta.get("proxy_log_notes")
    if notes:
        out += ["## Proxy log lines worth a look", "", "```", *notes, "```", ""]
    return "\n".join(out).rstrip() + "\n"


def _generic(res: dict[str, Any]) -> list[str]:
    rows = res.get("rows", [])
    if not rows:
        return ["(no rows)", ""]
    cols = [k for k in rows[0] if not isinstance(rows[0][k], list | dict)]
    return table(
        cols,
        [[fmt_num(r.get(c), 2) if isinstance(r.get(c), float) else str(r.get(c)) for c in cols] for r in rows],
    ) + [""]



# --------------------------------------------------------------------------------------------
# plots


def plots(results: dict[str, Any], outdir: Path) -> list[str]:
    """PNG files (names) of the scenarios in ``results``, written into ``outdir``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for name, res in results.get("scenarios", {}).items():
        scenario = REGISTRY.get(name)
        fn = scenario.plot if scenario else None
        if fn is None or not res.get("rows"):
            continue
        fig = fn(plt, res)
        if fig is None:
            continue
        path = outdir / f"{name}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path.name)
    return written



def _repeats(repeats: Any) -> str:
    """How often each scenario repeated, e.g. ``repeats: 5 (passthrough, share), 3 (ack)``, from
    ``{scenario: repeats}`` (older results hold one number for all)."""
    if not isinstance(repeats, dict) or not repeats:
        return f"{repeats if repeats is not None else '?'} repeat(s)"
    by: dict[int, list[str]] = {}
    for name, n in repeats.items():
        by.setdefault(n, []).append(name)
    parts = [f"{n} ({', '.join(names)})" for n, names in sorted(by.items(), reverse=True)]
    return "repeats: " + ", ".join(parts)

