"""The ``share`` scenario of ``kshare bench``: One share consumer: kshare (on Kafka 3.9) vs native Kafka 4.4 vs a classic consumer direct on 3.9."""

from __future__ import annotations

import uuid
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from .. import clients
from ..format import bars, fmt_num, fmt_ratio, fmt_records, fmt_size, table
from ..procs import cpu_seconds, load, rss_bytes
from .common import (
    DEFAULT_CACHE_MB,
    FULL_BATCHES_LINGER_MS,
    KAFKA4,
    MEMORY_OVERHEAD_MB,
    UPSTREAM,
    alternate,
    cache_budget_mb,
    median,
    per_round,
    scenario,
    target,
)

if TYPE_CHECKING:
    from ..runner import Env, Progress

SHARE_TARGET = 1.0  # kshare / native Kafka 4.4, first record -> last

SIZES = (
    {"records": {100: 1_200_000, 1024: 500_000}, "partition_counts": [1, 4, 16], "warmup": 4},
    {"records": {100: 60_000, 1024: 20_000}, "partition_counts": [1, 4, 16], "warmup": 1},
)


def run(env: Env, progress: Progress, *, records: dict[int, int], partition_counts: list[int],
        repeats: int, configs: list[str] | None = None, warmup: int = 1) -> dict[str, Any]:
    """``warmup``: untimed rounds of every configuration before the first combination is timed.
    The brokers' JITs keep warming for several runs: in one full run, native 4.4 read 100 B x 1 at
    594k rec/s in its single warm-up and 662k, 711k, 841k, 882k in the timed runs after it, so
    with one warm-up round the first combinations were compared with a native broker still
    getting faster."""
    proxy = env.proxy()
    configs = configs or ["classic", "kshare", "native"]
    k4 = env.kafka4() if "native" in configs else None
    # The proxy's memory while it reads topics far larger than its record cache: the cache keeps
    # slices of the Fetch responses, and evicted batches once kept theirs (1.6 GB resident with
    # the default 256 MB budget, one consumer on 16 partitions of 1 KiB records).
    budget_mb = cache_budget_mb(env.proxy_args, DEFAULT_CACHE_MB)
    rss_before = rss_bytes(proxy.pid)
    rss_peak = rss_before
    sizes = sorted(records)
    combos = [(size, parts) for size in sizes for parts in partition_counts]
    progress.begin("share", len(combos) * (1 + repeats * len(configs)) + warmup * len(configs))
    samples: list[dict[str, Any]] = []
    batches: dict[tuple[int, int], dict[str, int]] = {}  # record batches per topic and cluster
    for i, (size, parts) in enumerate(combos):
        n = records[size]
        topic = f"bench-share-{size}-{parts}-{uuid.uuid4().hex[:8]}"
        # Full producer batches on both clusters (a long linger): the same topic on Kafka 3.9
        # and 4.4, batch for batch. With the pass-through scenario's 10 ms linger the producer
        # made twice as many batches, half as large, on 3.9 as on 4.4 (16 partitions of 1 KiB
        # records), and a share consumer hands out whole batches.
        clients.create_topic(env.upstream(), topic, parts)
        clients.produce(env.upstream(), topic, n, size, parts, linger_ms=FULL_BATCHES_LINGER_MS)
        batches[(size, parts)] = {"kafka3": clients.count_batches(env.upstream(), topic)}
        if k4 is not None:
            clients.create_topic(k4, topic, parts)
            clients.produce(k4, topic, n, size, parts, linger_ms=FULL_BATCHES_LINGER_MS)
            batches[(size, parts)]["kafka4"] = clients.count_batches(k4, topic)
        progress.step(f"{n:,} x {size} B on {parts} partition(s) produced in "
                      f"{' / '.join(f'{c:,}' for c in batches[(size, parts)].values())} batches; load {load()}")
        try:
            runs = [(None, c) for w in range(warmup) for c in alternate(configs, w)] if i == 0 else []
            runs += [(r, c) for r in range(repeats) for c in alternate(configs, r)]
            for r, config in runs:
                c0 = cpu_seconds(proxy.pid)
                if config == "kshare":
                    run = clients.consume_share(proxy.bootstrap, topic, n)
                elif config == "classic":
                    run = clients.consume_classic(env.upstream(), topic, n)
                else:
                    run = clients.consume_share(k4, topic, n)  # type: ignore[arg-type]
                cpu = cpu_seconds(proxy.pid) - c0 if config == "kshare" else None
                rss = rss_bytes(proxy.pid) if config == "kshare" else None
                if rss is not None:
                    rss_peak = max(rss_peak, rss)
                if r is not None:
                    samples.append(
                        {
                            "config": config,
                            "value_size": size,
                            "partitions": parts,
                            "records": n,
                            "cpu_s": cpu,
                        }
                        | asdict(run)
                    )
                progress.step(
                    f"{'warm-up ' if r is None else ''}{config} {size} B x{parts}: {n / run.data_seconds:,.0f} rec/s, "
                    f"first record after {run.first_record_s:.2f} s"
                    + (f", proxy RSS {rss / 2**20:.0f} MB" if rss is not None else "")
                )
        finally:
            clients.delete_topic(env.upstream(), topic)
            if k4 is not None:
                clients.delete_topic(k4, topic)
    rows = []
    targets = []
    for size, parts in combos:
        n = records[size]
        row: dict[str, Any] = {"value_size": size, "partitions": parts, "records": n}
        row |= {f"batches_{k}": v for k, v in batches.get((size, parts), {}).items()}
        for config in configs:
            ss = [
                s
                for s in samples
                if s["config"] == config and s["value_size"] == size and s["partitions"] == parts
            ]
            row[f"{config}_rps"] = n / median([s["data_seconds"] for s in ss])
            row[f"{config}_first_s"] = median([s["first_record_s"] for s in ss])
            row[f"{config}_total_rps"] = n / median([s["seconds"] for s in ss])
            if config == "kshare":
                cpu = median([s["cpu_s"] for s in ss])
                row["kshare_cpu_s"] = cpu
                row["kshare_mcores_per_mbps"] = cpu * 1000 / (n * size / 1e6)
        if "native" in configs:
            row["kshare_native"] = row["kshare_rps"] / row["native_rps"]
            row["kshare_native_per_round"] = per_round(
                *([s["data_seconds"] for s in samples
                   if s["config"] == c and s["value_size"] == size and s["partitions"] == parts]
                  for c in ("kshare", "native")))
            targets.append(
                target(
                    f"share consumer {fmt_size(size)}, {parts} partition(s): kshare / native",
                    row["kshare_native"],
                    SHARE_TARGET,
                    ">=",
                )
            )
        if "classic" in configs:
            row["kshare_classic"] = row["kshare_rps"] / row["classic_rps"]
        rows.append(row)
    if "kshare" in configs:
        targets.append(
            target(
                f"proxy RSS after the share runs <= before + {budget_mb} MB cache budget + {MEMORY_OVERHEAD_MB} MB",
                rss_peak / 2**20,
                rss_before / 2**20 + budget_mb + MEMORY_OVERHEAD_MB,
                "<=",
                "MB",
            )
        )
    progress.end()
    return {
        "config": {
            "records": records,
            "partitions": partition_counts,
            "repeats": repeats,
            "warmup_rounds": warmup,
            "configs": configs,
        },
        "rows": rows,
        "samples": samples,
        "targets": targets,
        "rss_before_mb": rss_before / 2**20,
        "rss_peak_mb": rss_peak / 2**20,
        "cache_budget_mb": budget_mb,
    }


# -- results.md and the plot ----------------------------------------------------------------------


def section(res: dict[str, Any]) -> list[str]:
    cfg = res.get("config", {})
    configs = cfg.get("configs", ["classic", "kshare", "native"])
    names = {"classic": "classic direct (3.9)", "kshare": "kshare (3.9)", "native": "native 4.4"}
    head = ["value", "partitions"] + [f"{names.get(c, c)} rec/s" for c in configs]
    if "native" in configs:
        head += ["kshare / native", "per round"]
    if "classic" in configs:
        head.append("kshare / classic")
    head += [f"first record s: {c}" for c in configs] + ["kshare CPU s"]
    rows_in = res.get("rows", [])
    with_batches = any("batches_kafka3" in r for r in rows_in)
    if with_batches:
        head.append("batches 3.9 / 4.4")
    rows = []
    for r in rows_in:
        row = [fmt_size(r["value_size"]), str(r["partitions"])] + [fmt_num(r.get(f"{c}_rps")) for c in configs]
        if "native" in configs:
            row += [fmt_ratio(r.get("kshare_native")), fmt_ratio(r.get("kshare_native_per_round"))]
        if "classic" in configs:
            row.append(fmt_ratio(r.get("kshare_classic")))
        row += [fmt_num(r.get(f"{c}_first_s"), 2) for c in configs] + [fmt_num(r.get("kshare_cpu_s"), 2)]
        if with_batches:
            row.append(" / ".join(fmt_num(r.get(k)) for k in ("batches_kafka3", "batches_kafka4") if k in r))
        rows.append(row)
    text = [
        f"One confluent-kafka `ShareConsumer` (implicit acknowledgement; a classic `Consumer` for the "
        f"direct baseline), a fresh group per run, {fmt_records(cfg.get('records'))}, produced in full 1 MB "
        "batches on both clusters (*batches*: how many each topic holds). Rates are steady "
        "(first record to last); *first record* is the time from the first `poll()` to the first record "
        "(the group join included); *per round*: the median of kshare / native over the rounds, each "
        "taken side by side (the target is the ratio of the medians).",
        "",
    ]
    after = [""]
    if res.get("rss_peak_mb") is not None:
        after = [
            "",
            f"Proxy resident memory: {fmt_num(res.get('rss_before_mb'))} MB before these runs, at most "
            f"{fmt_num(res.get('rss_peak_mb'))} MB after any of them (record cache budget "
            f"{fmt_num(res.get('cache_budget_mb'))} MB).",
            "",
        ]
    return text + table(head, rows) + after


def plot(plt: Any, res: dict[str, Any]) -> Any:
    configs = res["config"].get("configs", ["classic", "kshare", "native"])
    rows = res["rows"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    groups = [f"{fmt_size(r['value_size'])} x{r['partitions']}" for r in rows]
    bars(
        ax1,
        groups,
        {c: [r.get(f"{c}_rps") for r in rows] for c in configs},
        "records/s (first -> last record)",
    )
    ax1.set_title("one consumer: steady rate", fontsize=10)
    bars(ax2, groups, {c: [r.get(f"{c}_first_s") for r in rows] for c in configs}, "seconds")
    ax2.set_title("time to the first record (join included)", fontsize=10)
    return fig


SCENARIO = scenario(
    __name__, 'One share consumer: kshare (Kafka 3.9) vs native Kafka 4.4 vs a classic consumer direct',
    # one share consumer reads 500,000 x 1 KiB in about a second, and single runs of the same configuration
    # spread over 0.7-1.4x their median (kshare and native alike): with 5 repeats the 1 KiB x 16 ratio's
    # median read 0.96-1.15 from one full run to the next
    default_repeats=7, needs=frozenset({UPSTREAM, KAFKA4}),
)
