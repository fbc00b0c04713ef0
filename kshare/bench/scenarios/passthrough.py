"""The ``passthrough`` scenario of ``kshare bench``: Pass-through produce and consume: direct, through a bare relay, through kshare."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from .. import clients
from ..format import bars, fmt_num, fmt_ratio, fmt_records, fmt_size, table
from ..procs import cpu_seconds
from .common import alternate, median, per_round, scenario, target

if TYPE_CHECKING:
    from ..runner import Env, Progress

PASSTHROUGH_TARGET = 0.95  # kshare / relay

# runs of 2-3 s (600,000 x 100 B and 300,000 x 1 KiB took 0.4-0.6 s, and single runs of the same
# configuration spread over +-25 %)
SIZES = ({"records": {100: 2_000_000, 1024: 1_000_000}}, {"records": {100: 100_000, 1024: 40_000}})


def run(env: Env, progress: Progress, *, records: dict[int, int], repeats: int, partitions: int = 4,
        configs: list[str] | None = None, warmup: bool = True) -> dict[str, Any]:
    proxy = env.proxy()
    bootstraps = {"direct": env.upstream(), "kshare": proxy.bootstrap}
    pids = {"kshare": proxy.pid}
    relay = env.relay()
    if relay is not None:
        bootstraps["relay"] = env.relay_bootstrap
        pids["relay"] = relay.pid
    configs = [c for c in (configs or ["direct", "relay", "kshare"]) if c in bootstraps]
    sizes = sorted(records)
    progress.begin("passthrough", (len(configs) if warmup else 0) + len(sizes) * repeats * len(configs))
    samples: list[dict[str, Any]] = []

    def one(config: str, size: int) -> dict[str, Any]:
        n = records[size]
        topic = clients.create_topic(
            env.upstream(), f"bench-pt-{config}-{size}-{uuid.uuid4().hex[:8]}", partitions
        )
        pid = pids.get(config)
        try:
            c0 = cpu_seconds(pid) if pid else None
            p_s = clients.produce(bootstraps[config], topic, n, size, partitions)
            c1 = cpu_seconds(pid) if pid else None
            c_s = clients.consume(bootstraps[config], topic, n, partitions)
            c2 = cpu_seconds(pid) if pid else None
        finally:
            clients.delete_topic(env.upstream(), topic)
        s = {"config": config, "value_size": size, "records": n, "produce_s": p_s, "consume_s": c_s}
        if pid:
            s["cpu_produce_s"], s["cpu_consume_s"] = c1 - c0, c2 - c1  # type: ignore[operator]
        return s

    if warmup:  # the broker's JIT, page cache, the processes' first connections
        for config in configs:
            s = one(config, sizes[0])
            progress.step(f"warm-up {config}: produce {s['records'] / s['produce_s']:,.0f} rec/s")
    for size in sizes:
        for r in range(repeats):
            for config in alternate(configs, r):
                s = one(config, size)
                samples.append(s)
                progress.step(
                    f"{config} {size} B: produce {s['records'] / s['produce_s']:,.0f} rec/s, "
                    f"consume {s['records'] / s['consume_s']:,.0f} rec/s"
                )
    rows = []
    targets = []
    for kind in ("produce", "consume"):
        for size in sizes:
            n = records[size]
            row: dict[str, Any] = {"workload": kind, "value_size": size, "records": n}
            for config in configs:
                ss = [s for s in samples if s["config"] == config and s["value_size"] == size]
                secs = median([s[f"{kind}_s"] for s in ss])
                row[f"{config}_rps"] = n / secs
                row[f"{config}_mbps"] = n * size / 1e6 / secs
                cpus = [s[f"cpu_{kind}_s"] for s in ss if f"cpu_{kind}_s" in s]
                if cpus:
                    row[f"{config}_cpu_s"] = median(cpus)
                    # millicores per MB/s = CPU seconds per MB x 1000
                    row[f"{config}_mcores_per_mbps"] = median(cpus) * 1000 / (n * size / 1e6)
            if "relay" in configs and "kshare" in configs:
                row["kshare_relay"] = row["kshare_rps"] / row["relay_rps"]
                row["kshare_relay_per_round"] = per_round(
                    *([s[f"{kind}_s"] for s in samples if s["config"] == c and s["value_size"] == size]
                      for c in ("kshare", "relay")))
                targets.append(
                    target(
                        f"pass-through {kind} {fmt_size(size)}: kshare / relay",
                        row["kshare_relay"],
                        PASSTHROUGH_TARGET,
                        ">=",
                    )
                )
            if "direct" in configs and "kshare" in configs:
                row["kshare_direct"] = row["kshare_rps"] / row["direct_rps"]
            rows.append(row)
    progress.end()
    return {
        "config": {"records": records, "partitions": partitions, "repeats": repeats, "configs": configs},
        "rows": rows,
        "samples": samples,
        "targets": targets,
    }


# -- results.md and the plot ----------------------------------------------------------------------


def section(res: dict[str, Any]) -> list[str]:
    cfg = res.get("config", {})
    configs = cfg.get("configs", ["direct", "relay", "kshare"])
    head = ["workload", "value"] + [f"{c} rec/s (MB/s)" for c in configs]
    if "relay" in configs:
        head += ["kshare / relay", "per round"]
    head += ["kshare / direct", "proxy CPU s", "proxy mcores per MB/s"]
    rows = []
    for r in res.get("rows", []):
        row = [r["workload"], fmt_size(r["value_size"])]
        row += [f"{fmt_num(r.get(f'{c}_rps'))} ({fmt_num(r.get(f'{c}_mbps'), 1)})" for c in configs]
        if "relay" in configs:
            row += [fmt_ratio(r.get("kshare_relay")), fmt_ratio(r.get("kshare_relay_per_round"))]
        row += [
            fmt_ratio(r.get("kshare_direct")),
            fmt_num(r.get("kshare_cpu_s"), 2),
            fmt_num(r.get("kshare_mcores_per_mbps"), 1),
        ]
        rows.append(row)
    text = [
        f"{fmt_records(cfg.get('records'))} per run over {cfg.get('partitions', '?')} partitions, producer "
        "acks=all with 1 MB batches, consumer assigned from the beginning; clocks from the first record "
        "produced to `flush()`, from `assign()` to the last record; *per round*: the median of kshare / relay "
        "over the rounds, each taken side by side (the target is the ratio of the medians).",
        "",
    ]
    return text + table(head, rows, "ll" + "r" * (len(head) - 2)) + [""]


def plot(plt: Any, res: dict[str, Any]) -> Any:
    configs = res["config"].get("configs", ["direct", "relay", "kshare"])
    rows = res["rows"]
    fig, ax = plt.subplots(figsize=(8, 4))
    groups = [f"{r['workload']} {fmt_size(r['value_size'])}" for r in rows]
    bars(ax, groups, {c: [r.get(f"{c}_rps") for r in rows] for c in configs}, "records/s")
    ax.set_title("pass-through: records/s (medians)", fontsize=10)
    return fig


SCENARIO = scenario(
    __name__, 'Pass-through produce and consume: direct, bare relay, kshare',
    # single runs of the same configuration spread +-15 % on the project's shared 2-core machine (the broker,
    # the client and the proxy share 2 cores), and a classic consumer's runs took one of two rates (600,000
    # x 100 B in 2.3 or 3.3 s, direct as well as through the relay or kshare; librdkafka's fetch queue
    # backoff, now 5 ms), so a median of 3 could compare one rate with the other; the machine also has slow
    # spells of several seconds (the same consume of 2,000,000 x 100 B, direct, took 1.5-1.75 s instead of
    # 1.2 s and 1.4x the CPU time, no steal, no I/O wait): with 7 repeats a ratio's median still read
    # 0.88-1.10 for the same code
    default_repeats=11,
)
