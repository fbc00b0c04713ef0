"""``results.md`` and the PNG plots of a ``kshare bench`` run, from its results dict (``results.json``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

TITLES = {
    "passthrough": "Pass-through produce and consume: direct, bare relay, kshare",
    "share": "One share consumer: kshare (Kafka 3.9) vs native Kafka 4.4 vs a classic consumer direct",
    "scaling": "Scaling past partitions: 5 ms of work per record",
    "latency": "End-to-end latency at a fixed rate",
    "ack": "ShareAcknowledge round trip with concurrent members",
    "cpu": "Proxy CPU per MB/s delivered",
    "memory": "Proxy memory with many share-partitions and connections",
    "embedded": "kshare on its embedded broker (no --upstream) vs native Kafka 4.4: latency over time, time to ready",
    "spark": "The kshare PySpark source vs Spark's own Kafka source: 5 ms of work per record",
    "failover": "Failover: three brokers restarted one by one and one killed under share consumers, "
    "kshare (Kafka 3.9) vs native Kafka 4.4",
}
COLORS = {
    "direct": "tab:gray",
    "classic": "tab:gray",
    "relay": "tab:orange",
    "kshare": "tab:blue",
    "native": "tab:green",
    "kafka": "tab:red",
    "kshare-watch20": "tab:cyan",  # the spark scenario's kshare source with its commit watch at 20 ms
}


def _num(x: Any, digits: int = 0) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:,.{digits}f}"


def _ratio(x: Any) -> str:
    return _num(x, 2)


def _size(b: int) -> str:
    return "1 KiB" if b == 1024 else f"{b} B"


def _table(columns: list[str], rows: list[list[str]], align: str | None = None) -> list[str]:
    align = align or "l" + "r" * (len(columns) - 1)
    sep = ["---:" if a == "r" else "---" for a in align]
    return ["| " + " | ".join(columns) + " |", "| " + " | ".join(sep) + " |"] + [
        "| " + " | ".join(r) + " |" for r in rows
    ]


def _mark(t: dict[str, Any]) -> str:
    return "**met**" if t.get("met") else "**not met**"


def _fmt_target(t: dict[str, Any]) -> str:
    value = t.get("value")
    unit = (
        f" {t['unit']}"
        if t.get("unit") and t["unit"] not in ("MB",)
        else (" MB" if t.get("unit") == "MB" else "")
    )
    digits = 0 if t.get("unit") == "MB" else 2
    return f"{_num(value, digits)}{unit}", f"{t['op']} {_num(t['threshold'], digits)}{unit}"


# --------------------------------------------------------------------------------------------
# markdown


def markdown(results: dict[str, Any]) -> str:
    meta = results.get("meta", {})
    machine = meta.get("machine", {})
    out = ["# kshare bench", ""]
    out.append(
        f"`{meta.get('command', 'kshare bench')}` -- started {meta.get('started', '?')}, "
        f"{_num(meta.get('elapsed_s'))} s, {_repeats(meta.get('repeats'))}"
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
        out += _table(["target", "measured", "target", ""], rows, "lrrl")
        met = sum(1 for _, t in targets if t.get("met"))
        out += ["", f"{met} of {len(targets)} met.", ""]
    for name, err in results.get("errors", {}).items():
        out += [f"**{name} failed**: `{err}`", ""]
    for name, res in results.get("scenarios", {}).items():
        out += [f"## {TITLES.get(name, name)} (`{name}`)", ""]
        out += SECTIONS.get(name, _generic)(res)
        plots = [p for p in results.get("plots", []) if Path(p).stem.startswith(name)]
        for p in plots:
            out += [f"![{name}]({Path(p).name})", ""]
        out += [f"({_num(res.get('seconds'))} s)", ""]
    left = meta.get("broker_data_left_mb")
    if left:
        out += ["Left on the brokers' disks at the end (the bench deletes its topics as it goes): "
                + ", ".join(f"Apache Kafka {v} {_num(mb)} MB" for v, mb in sorted(left.items())) + ".", ""]
    notes = meta.get("proxy_log_notes")
    if notes:
        out += ["## Proxy log lines worth a look", "", "```", *notes, "```", ""]
    return "\n".join(out).rstrip() + "\n"


def _generic(res: dict[str, Any]) -> list[str]:
    rows = res.get("rows", [])
    if not rows:
        return ["(no rows)", ""]
    cols = [k for k in rows[0] if not isinstance(rows[0][k], list | dict)]
    return _table(
        cols,
        [[_num(r.get(c), 2) if isinstance(r.get(c), float) else str(r.get(c)) for c in cols] for r in rows],
    ) + [""]


def _passthrough(res: dict[str, Any]) -> list[str]:
    cfg = res.get("config", {})
    configs = cfg.get("configs", ["direct", "relay", "kshare"])
    head = ["workload", "value"] + [f"{c} rec/s (MB/s)" for c in configs]
    if "relay" in configs:
        head += ["kshare / relay", "per round"]
    head += ["kshare / direct", "proxy CPU s", "proxy mcores per MB/s"]
    rows = []
    for r in res.get("rows", []):
        row = [r["workload"], _size(r["value_size"])]
        row += [f"{_num(r.get(f'{c}_rps'))} ({_num(r.get(f'{c}_mbps'), 1)})" for c in configs]
        if "relay" in configs:
            row += [_ratio(r.get("kshare_relay")), _ratio(r.get("kshare_relay_per_round"))]
        row += [
            _ratio(r.get("kshare_direct")),
            _num(r.get("kshare_cpu_s"), 2),
            _num(r.get("kshare_mcores_per_mbps"), 1),
        ]
        rows.append(row)
    text = [
        f"{_records(cfg.get('records'))} per run over {cfg.get('partitions', '?')} partitions, producer "
        "acks=all with 1 MB batches, consumer assigned from the beginning; clocks from the first record "
        "produced to `flush()`, from `assign()` to the last record; *per round*: the median of kshare / relay "
        "over the rounds, each taken side by side (the target is the ratio of the medians).",
        "",
    ]
    return text + _table(head, rows, "ll" + "r" * (len(head) - 2)) + [""]


def _records(records: Any) -> str:
    if isinstance(records, dict):
        return ", ".join(f"{int(v):,} x {_size(int(k))}" for k, v in records.items())
    return str(records)


def _share(res: dict[str, Any]) -> list[str]:
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
        row = [_size(r["value_size"]), str(r["partitions"])] + [_num(r.get(f"{c}_rps")) for c in configs]
        if "native" in configs:
            row += [_ratio(r.get("kshare_native")), _ratio(r.get("kshare_native_per_round"))]
        if "classic" in configs:
            row.append(_ratio(r.get("kshare_classic")))
        row += [_num(r.get(f"{c}_first_s"), 2) for c in configs] + [_num(r.get("kshare_cpu_s"), 2)]
        if with_batches:
            row.append(" / ".join(_num(r.get(k)) for k in ("batches_kafka3", "batches_kafka4") if k in r))
        rows.append(row)
    text = [
        f"One confluent-kafka `ShareConsumer` (implicit acknowledgement; a classic `Consumer` for the "
        f"direct baseline), a fresh group per run, {_records(cfg.get('records'))}, produced in full 1 MB "
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
            f"Proxy resident memory: {_num(res.get('rss_before_mb'))} MB before these runs, at most "
            f"{_num(res.get('rss_peak_mb'))} MB after any of them (record cache budget "
            f"{_num(res.get('cache_budget_mb'))} MB).",
            "",
        ]
    return text + _table(head, rows) + after


def _scaling(res: dict[str, Any]) -> list[str]:
    cfg = res.get("config", {})
    head = [
        "consumers on partitions",
        "ideal rec/s",
        "kshare rec/s",
        "kshare of ideal",
        "native 4.4 rec/s",
        "native of ideal",
        "busy consumers kshare / native",
    ]
    rows = [
        [
            f"{r['consumers']} on {r['partitions']}",
            _num(r["ideal_rps"]),
            _num(r.get("kshare_rps")),
            _pct(r.get("kshare_of_ideal")),
            _num(r.get("native_rps")),
            _pct(r.get("native_of_ideal")),
            f"{r.get('kshare_busy', '-')} / {r.get('native_busy', '-')}",
        ]
        for r in res.get("rows", [])
    ]
    text = [
        f"N `ShareConsumer`s (threads, max.poll.records {cfg.get('max_poll_records', '?')}), "
        f"{cfg.get('work_ms', 5):g} ms of work per record (a sleep), N x {1000 / cfg.get('work_ms', 5):.0f} "
        f"x {cfg.get('seconds', '?')} s of records in one-record producer batches; the rate is measured "
        "while every consumer is busy (from the last consumer's first record to the first one's last).",
        "",
    ]
    return text + _table(head, rows) + [""]


def _pct(x: Any) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{100 * x:.0f}%"


def _latency(res: dict[str, Any]) -> list[str]:
    cfg = res.get("config", {})
    names = {
        "direct": "classic consumer direct (3.9)",
        "kshare": "kshare share consumer (3.9)",
        "native": "native share consumer (4.4)",
    }
    rows = [
        [
            names.get(r["system"], r["system"]),
            _num(r["p50_ms"], 2),
            _num(r["p99_ms"], 2),
            _num(r["p999_ms"], 2),
            _num(r["max_ms"], 1),
            f"{_num(r['received'])} / {_num(r['sent'])}",
            str(r.get("duplicates", 0)),
        ]
        for r in res.get("rows", [])
    ]
    text = [
        f"One producer at {_num(cfg.get('rate'))} records/s ({cfg.get('value_size', 100)} B, linger.ms 5, "
        f"acks=all) and one consumer, each its own process, {cfg.get('seconds', '?')} s per run; latency = "
        "time `poll()` returned the record - time it was handed to `produce()` (one clock). The producer and "
        "consumer of kshare bootstrap from kshare.",
        "",
    ]
    return (
        text
        + _table(
            ["consumer", "p50 ms", "p99 ms", "p99.9 ms", "max ms", "received / sent", "duplicates"], rows
        )
        + [""]
    )


def _ack(res: dict[str, Any]) -> list[str]:
    cfg = res.get("config", {})
    rows = [
        [
            r.get("system", "kshare"),
            "closed loop" if not r.get("rate") else f"{r['rate']:,.0f} cycles/s",
            str(r["members"]),
            _num(r["acks"]),
            _num(r.get("acks_per_s", float("nan"))),
            _num(r["p50_ms"], 2),
            _num(r["p99_ms"], 2),
            _num(r["mean_ms"], 2),
            _ratio(r.get("vs_one")),
        ]
        for r in res.get("rows", [])
    ]
    text = [
        f"N members (each on its own connection and partition, `kshare.client.KafkaConnection`) fetch "
        f"{cfg.get('records_per_ack', '?')} records and acknowledge them (ACCEPT) in one ShareAcknowledge; the "
        "round trip includes the durable state write (kshare: a Produce with acks=all to the 3.9 cluster; "
        "native Kafka 4.4: its share coordinator's write). Two loads: a closed loop (every member as fast "
        "as it can, so on a small machine the CPU sets the pace and the p50 grows with the members by "
        "Little's law) and, where configured, a fixed number of fetch-and-acknowledge cycles a second "
        "shared by the members (the cost of concurrency itself, at the same load). The target is the paced "
        "load's; acks/s is the run's rate (in the closed loop, the throughput each system reached).",
        "",
    ]
    return (
        text
        + _table(["system", "load", "members", "acks", "acks/s", "p50 ms", "p99 ms", "mean ms", "p50 / p50 of one"], rows)
        + [""]
    )


def _cpu(res: dict[str, Any]) -> list[str]:
    rows = [
        [
            r["workload"],
            _size(r["value_size"]),
            _num(r["mbps"], 1),
            _num(r["cpu_s"], 2),
            _num(r["mcores_per_mbps"], 1),
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
        + _table(["workload", "value", "MB/s", "proxy CPU s", "millicores per MB/s"], rows, "llrrr")
        + [""]
    )


def _memory(res: dict[str, Any]) -> list[str]:
    out = []
    for r in res.get("rows", []):
        out += [
            f"{r['groups']} share groups x {r['members_per_group']} members (one connection each) on a "
            f"{r['partitions']:,}-partition topic ({r['data_mb']:.0f} MB of records), each member fetching its "
            f"partitions and acknowledging what it got; a fresh proxy with `--record-cache-mb "
            f"{r['cache_budget_mb']}`.",
            "",
        ]
        out += _table(
            ["figure", "value"],
            [
                ["share-partitions touched", _num(r["share_partitions_touched"])],
                ["client connections (metric)", _num(r["client_connections_metric"])],
                ["records acquired", _num(r["records_acquired"])],
                ["RSS idle (before)", f"{_num(r['rss_idle_mb'])} MB"],
                ["RSS peak", f"{_num(r['rss_peak_mb'])} MB"],
                ["RSS loaded (after, connections open)", f"{_num(r['rss_loaded_mb'])} MB"],
                ["RSS after the members left", f"{_num(r['rss_after_close_mb'])} MB"],
                ["kshare_record_cache_bytes (loaded)", f"{_num(r['record_cache_mb'], 1)} MB"],
                ["record cache budget", f"{r['cache_budget_mb']} MB"],
                ["partitions with a record cache", _num(r["record_cache_partitions"])],
                ["limit: idle + budget + fixed overhead", f"{_num(r['rss_limit_mb'])} MB"],
                ["proxy CPU during the load", f"{_num(r['cpu_s'], 1)} s"],
            ],
            "lr",
        )
        out.append("")
    return out


def _embedded(res: dict[str, Any]) -> list[str]:
    cfg = res.get("config", {})
    rate, window = cfg.get("rate", 0), cfg.get("window_s", 10)
    names = {"kshare": "kshare, embedded Apache Kafka 3.9", "native": "native Kafka 4.4 share groups"}
    out = [
        f"One producer at {_num(rate)} records/s ({cfg.get('value_size', 100)} B, linger.ms "
        f"{cfg.get('linger_ms', 5)}, acks=all) and "
        f"one confluent-kafka `ShareConsumer`, each its own process, for {_num(cfg.get('warmup_s'))} s of "
        f"warm-up (left out of every figure, for both) and {_num(cfg.get('seconds'))} s measured, first "
        "through `kshare proxy` with no `--upstream` (its embedded broker, the last proxy started below), "
        "then directly on native Apache Kafka 4.4 share groups; latency = time `poll()` returned the record "
        f"- time it was handed to `produce()` (one clock). Windows: {window:g} s of send time each."
        + (
            " With linger.ms 0 each record goes out in a Produce request of its own, as a latency-minded "
            "producer sends it; librdkafka's default (5) would add up to 5 ms of waiting in the producer "
            "to both systems."
            if cfg.get("linger_ms") == 0
            else ""
        ),
        "",
    ]
    rows = [
        [
            names.get(r["system"], r["system"]),
            _num(r["p50_ms"], 2),
            _num(r["p99_ms"], 2),
            _num(r["p999_ms"], 2),
            _num(r["max_ms"], 1),
            f"{_num(r.get('window_p50_min_ms'), 2)} - {_num(r.get('window_p50_max_ms'), 2)}",
            f"{_num(r.get('window_p99_min_ms'), 2)} - {_num(r.get('window_p99_max_ms'), 2)}",
            f"{_num(r['received'])} / {_num(r['sent'])}",
            str(r.get("duplicates", 0)),
        ]
        for r in res.get("rows", [])
    ]
    out += _table(
        ["system", "p50 ms", "p99 ms", "p99.9 ms", "max ms", f"{window:g} s medians ms", f"{window:g} s p99s ms",
         "received / sent", "duplicates"],
        rows,
    )
    out.append("")
    ready = res.get("ready", {})
    starts = res.get("starts", [])
    if starts:
        out += [
            f"Time to ready: from starting `{cfg.get('command', 'kshare proxy')}` to the first 200 of `/ready` on "
            "its metrics port; the first start with an empty `KSHARE_CACHE` (the jars fetched from Maven "
            "Central) and an empty `--data-dir`, then restarts with the same cache and data dir "
            f"(**first {_num(ready.get('first_s'), 1)} s, later {_num(ready.get('later_median_s'), 1)} s median**).",
            "",
        ]
        out += _table(
            ["start", "ready s", "embedded broker up s", "fetched"],
            [
                [
                    st.get("run", "?"),
                    _num(st.get("ready_s"), 2),
                    _num(st.get("broker_start_s"), 1),
                    f"{st['fetched_jars']} jars, {_num(st.get('fetched_mb'))} MB" if st.get("fetched_jars") else "-",
                ]
                for st in starts
            ],
            "lrrl",
        )
        out.append("")
    by = {r["system"]: {w["start_s"]: w for w in r.get("windows", []) if not w.get("warmup")} for r in res.get("rows", [])}
    systems = list(by)
    if systems:
        head = ["window (s after the warm-up)"]
        for name in systems:
            head += [f"{name} p50 ms", f"{name} p99 ms", f"{name} records"]
        table = []
        for start in sorted({t for ws in by.values() for t in ws}):
            row = [f"{start:g}-{start + window:g}"]
            for name in systems:
                w = by[name].get(start)
                row += [_num(w["p50_ms"], 2), _num(w["p99_ms"], 2), _num(w["received"])] if w else ["-"] * 3
            table.append(row)
        out += _table(head, table) + [""]
    notes = res.get("proxy_log_notes")
    if notes:
        out += ["The embedded kshare proxy's log lines worth a look:", "", "```", *notes, "```", ""]
    return out


def _spark(res: dict[str, Any]) -> list[str]:
    cfg = res.get("config", {})
    per_task, work = cfg.get("per_task", 500), cfg.get("work_ms", 5)
    out = [
        f"One Spark session ({cfg.get('spark', '?')}, `local[{cfg.get('cores', '?')}]`, "
        f"`spark.jars.packages={cfg.get('packages', '?')}`), streaming queries one after the other: "
        f"`value` -> a Python UDF sleeping {work:g} ms -> `foreachBatch` counting the rows of each task (one "
        "action), default trigger (processing time 0). The kshare source (`format(\"kshare\")`) reads through "
        "the kshare proxy, `parallelism` = tasks, `maxRecordsPerTask` "
        f"{per_task}, a fresh share group each query with `share.partition.max.record.locks` twice what one "
        "micro-batch holds of a partition (at most 4000, kshare's default cap); Spark's Kafka source "
        "(`format(\"kafka\")`) reads the same topic from the Kafka 3.9 broker directly, `startingOffsets` "
        f"earliest, `minPartitions` = tasks, `maxOffsetsPerTrigger` = tasks x {per_task}. Topics of "
        f"{cfg.get('value_size', 100)} B records in 16 KB producer batches, tasks x {1000 / work:.0f} x "
        f"{_num(cfg.get('seconds'))} s of records per query (whole micro-batches of tasks x {per_task}).",
        "",
        "From `StreamingQueryProgress` (`query.recentProgress`), the first micro-batch left out: records/s = "
        "the rows of the later micro-batches / the time from the end of the first to the end of the last; "
        f"overhead per micro-batch = `durationMs.triggerExecution` - rows x {work:g} ms / tasks (the ideal), "
        "mean (median in brackets); 2nd = the overhead of the first measured micro-batch (the Python "
        "workers' first read). Medians over the repeats.",
        "",
    ]
    rows = res.get("rows", [])
    pairs = [r for r in rows if any((r["partitions"], r["tasks"]) == tuple(p) for p in cfg.get("pairs", []))]
    alone = [r for r in rows if r["kind"] == "kshare" and r["partitions"] == 1]

    def phases(r: dict[str, Any]) -> str:
        ph = r.get("phases_ms") or {}
        return " / ".join(_num(ph.get(k)) for k in ("addBatch", "latestOffset", "walCommit", "commitOffsets"))

    names = {"kafka": "Spark's Kafka source", "kshare": "kshare source"}
    out += _table(
        ["partitions, tasks", "source", "records/s", "of ideal", "vs Kafka source", "overhead ms", "2nd ms",
         "rows / micro-batch", "addBatch / latestOffset / walCommit / commitOffsets ms"],
        [
            [
                f"{r['partitions']}, {r['tasks']}",
                names.get(r["kind"], r["kind"].replace("kshare-watch", "kshare source, commit watch ") + " ms"),
                _num(r.get("records_per_s")),
                _pct(r.get("of_ideal")),
                _ratio(r.get("vs_kafka_rps")) if r["kind"] != "kafka" else "1",
                f"{_num(r.get('overhead_ms'))} ({_num(r.get('overhead_median_ms'))})",
                _num(r.get("second_batch_overhead_ms")),
                _num(r.get("rows_per_batch")),
                phases(r),
            ]
            for r in pairs
        ],
        "llrrrrrrr",
    )
    out.append("")
    out += _spark_rounds(res)
    if alone:
        out += ["The kshare source alone on one partition:", ""]
        out += _table(
            ["parallelism", "record locks", "ideal rec/s", "records/s", "of ideal", "overhead ms", "2nd ms",
             "rows / micro-batch", "addBatch / latestOffset / walCommit / commitOffsets ms"],
            [
                [
                    str(r["tasks"]),
                    _num(r.get("record_locks")),
                    _num(r.get("ideal_rps")),
                    _num(r.get("records_per_s")),
                    _pct(r.get("of_ideal")),
                    f"{_num(r.get('overhead_ms'))} ({_num(r.get('overhead_median_ms'))})",
                    _num(r.get("second_batch_overhead_ms")),
                    _num(r.get("rows_per_batch")),
                    phases(r),
                ]
                for r in sorted(alone, key=lambda r: r["tasks"])
            ],
        )
        out.append("")
    failed = [r for r in rows if r.get("failed")]
    for r in failed:
        out += [f"**{r['label']}: {r['failed']} query(ies) failed** (see results.json, spark.log).", ""]
    return out


_FAILOVER_NAMES = {"kshare": "kshare on Kafka 3.9", "native": "native Kafka 4.4"}


def _failover(res: dict[str, Any]) -> list[str]:
    cfg = res.get("config", {})
    rows = res.get("rows", [])
    out = [
        f"For each system its own three KRaft nodes (replication factor 3, `min.insync.replicas` 2), one "
        f"system after the other: Apache Kafka 3.9 with `kshare proxy --upstream <the three nodes>` (its own "
        f"process) and Apache Kafka 4.4 with share groups, used directly. A {cfg.get('partitions', 6)}-partition "
        f"topic with {_num(cfg.get('records_before'))} records ({cfg.get('value_size', 100)} B, written straight "
        f"to the cluster on both); {cfg.get('consumers', 4)} confluent-kafka `ShareConsumer`s (each its own "
        f"process, implicit acknowledgement, `max.poll.records` {cfg.get('max_poll', 100)}, "
        f"{_num(cfg.get('work_ms'), 0)} ms of work a record) drain it while an idempotent acks=all producer (its own "
        f"process) writes {_num(cfg.get('records_during'))} more at {_num(cfg.get('rate'))} a second (through "
        f"kshare for kshare, directly for native). After {_num(cfg.get('baseline_s'))} s: "
        f"{', '.join(cfg.get('faults', []))}, one after the other; each node is started again at once, and "
        "before the next fault the bench waits, as a rolling restart does, until every replica is in sync "
        f"and the preferred leaders are back, then {_num(cfg.get('settle_s'))} s. "
        f"`share.record.lock.duration.ms` {_num(cfg.get('lock_ms'))} on both groups (native: also its "
        "broker default `group.share.record.lock.duration.ms`). The run ends when every record was "
        "delivered and no delivery came for a lock's duration + 5 s; then a new consumer of the group "
        "polls for 8 s (what was acknowledged must stay so: it gets nothing).",
        "",
        "*Redelivery*: a delivery of a record delivered before (counted in the window it happened in). "
        "*Stall*: a stretch without any delivery while some record was available and not yet delivered "
        "(from the first delivery on). *Producer's stall*: the longest time between two successful delivery "
        "reports; *longest produce wait*: the longest time one record took from `produce()` to its "
        "report. Times in seconds.",
        "",
    ]
    head = ["", *(_FAILOVER_NAMES.get(r["system"], r["system"]) for r in rows)]

    def line(label: str, key: str, digits: int = 0, fmt: Any = None) -> list[str]:
        return [label, *((fmt(r) if fmt else _num(r.get(key), digits)) for r in rows)]

    table = [
        line("records (acknowledged by the cluster)", "records"),
        line("records lost", "lost"),
        line("deliveries", "deliveries"),
        line("redeliveries, whole run (% of the records)", "", fmt=lambda r: (
            f"{_num(r.get('redeliveries'))} ({_num(r.get('redelivered_pct'), 1)} %)")),
        line("redeliveries over the roll + kill (% of the records)", "", fmt=lambda r: (
            f"{_num(r.get('roll_redeliveries'))} ({_num(r.get('roll_redelivered_pct'), 1)} %)")),
        line("longest stall from the first fault on", "longest_stall_s", 1),
        line("longest stall before the faults", "baseline_longest_stall_s", 1),
        line("producer's longest stall", "producer_longest_gap_s", 1),
        line("longest produce wait", "producer_longest_wait_s", 1),
        line("produce failures", "produce_failed"),
        line("failed acknowledgements (records)", "", fmt=lambda r: _num(sum((r.get("ack_failed") or {}).values()))),
        line("a newcomer got, after the run", "late_deliveries"),
        line("run, s (drain after the last fault)", "", fmt=lambda r: (
            f"{_num(r.get('seconds'))} ({_num(r.get('drain_s'))})")),
    ]
    out += _table(head, table) + [""]
    for r in rows:
        name = _FAILOVER_NAMES.get(r["system"], r["system"])
        out += [f"**{name}**, per fault (window: from its signal to the next fault's; the last one to the end):", ""]
        wrows = []
        for w in r.get("windows", []):
            fault = "signal" in w or "exit_s" in w
            wrows.append([
                w.get("name", "?"),
                _num(w.get("at_s"), 0),
                f"{_num(w.get('exit_s'), 1)} / {_num(w.get('back_s'), 1)} / {_num(w.get('in_sync_s'), 0)} / "
                f"{_num(w.get('leaders_back_s'), 0)}" if fault else "-",
                ",".join(str(p) for p in w.get("partitions", [])) if fault else "-",
                _num(w.get("deliveries")),
                f"{_num(w.get('redeliveries'))} ({_num(w.get('redelivered_pct'), 1)} %)",
                _num(w.get("first_record_s"), 2) if fault else "-",
                _num(w.get("first_record_of_its_partitions_s"), 2) if fault else "-",
                _num(w.get("longest_stall_s"), 2),
                _num(w.get("producer_longest_gap_s"), 2),
                _num(w.get("producer_longest_wait_s"), 2),
            ])
        out += _table(
            ["window", "at s", "exited / back / in sync / leaders back, s after the signal", "its partitions",
             "deliveries", "redeliveries", "first record after the signal", "first record of each of its partitions",
             "longest stall", "producer's longest stall", "longest produce wait"],
            wrows,
        )
        out.append("")
        extra = []
        if r.get("lost"):
            extra.append(f"lost record ids (first 20): {r.get('lost_ids')}")
        if r.get("stalls_over_1s"):
            extra.append("stalls over 1 s (s after the consumers started, length): "
                         + ", ".join(f"{a:g} s: {b:g} s" for a, b in r["stalls_over_1s"][:20]))
        if r.get("client_errors"):
            extra.append(f"client errors: {r['client_errors']}")
        if r.get("ack_failed"):
            extra.append(f"acknowledgements that failed (records, by error): {r['ack_failed']}")
        if r.get("slow_produce"):
            extra.append("records that took over 2 s from `produce()` to their report (window, partition: "
                         "records, longest): " + "; ".join(
                             f"{x['window']}, {x['partition']}: {x['records']}, {_num(x['max_wait_s'], 1)} s"
                             for x in r["slow_produce"]))
        if r.get("produce_errors"):
            extra.append(f"produce errors: {r['produce_errors']}")
        if "proxy_running_at_end" in r:
            extra.append(f"kshare proxy running at the end: {'yes' if r['proxy_running_at_end'] else '**no**'}")
        out += [f"* {e}" for e in extra] + ([""] if extra else [])
    plog = res.get("proxy_log") or {}
    if plog.get("counts"):
        c = plog["counts"]
        out += [f"kshare's log: {c.get('WARNING', 0)} WARNING, {c.get('ERROR', 0)} ERROR, "
                f"{c.get('Traceback', 0)} traceback line(s); the distinct messages (numbers masked):", ""]
        if plog.get("distinct"):
            out += _table(["count", "first seen"], [[str(d["count"]), "`" + d["first"].replace("|", "/") + "`"]
                                                    for d in plog["distinct"]], "rl")
            out.append("")
    metrics = res.get("proxy_metrics") or {}
    if metrics:
        out += ["kshare's metrics at the end: " + ", ".join(f"`{k}` {_num(v, 0 if float(v).is_integer() else 3)}"
                                                          for k, v in sorted(metrics.items())), ""]
    if cfg.get("command"):
        out += [f"The proxy: `{cfg['command']}`.", ""]
    return out


def _spark_rounds(res: dict[str, Any]) -> list[str]:
    """Round by round: each repeat ran the configurations of a pair one after the other."""
    samples = [s for s in res.get("samples", []) if "error" not in s and s.get("repeat") is not None]
    out = []
    for p, t in (tuple(x) for x in res.get("config", {}).get("pairs", [])):
        by = {(s["kind"], s["repeat"]): s for s in samples if (s["partitions"], s["tasks"]) == (p, t)}
        rounds = sorted({r for _, r in by})

        def pairs(a: str, b: str, by: dict = by, rounds: list = rounds) -> list[tuple[dict, dict]]:
            return [(by[(a, r)], by[(b, r)]) for r in rounds if (a, r) in by and (b, r) in by]

        ks = pairs("kshare", "kafka")
        if not ks:
            continue
        line = (
            f"{p} partition{'s' if p > 1 else ''} x {t} tasks, round by round: kshare / Kafka source records/s "
            + ", ".join(_ratio(k["records_per_s"] / f["records_per_s"]) for k, f in ks)
            + "; kshare's overhead - the Kafka source's "
            + ", ".join(f"{k['overhead_ms'] - f['overhead_ms']:+,.0f}" for k, f in ks)
            + " ms"
        )
        for kind in sorted({k for k, _ in by if k.startswith("kshare-watch")}):
            ws = pairs(kind, "kshare")
            if ws:
                line += (f"; {kind.removeprefix('kshare-watch')} ms commit watch / 100 ms, records/s "
                         + ", ".join(_ratio(w["records_per_s"] / k["records_per_s"]) for w, k in ws))
        out += [line + ".", ""]
    return out


SECTIONS = {
    "passthrough": _passthrough,
    "share": _share,
    "scaling": _scaling,
    "latency": _latency,
    "ack": _ack,
    "cpu": _cpu,
    "memory": _memory,
    "embedded": _embedded,
    "spark": _spark,
    "failover": _failover,
}


# --------------------------------------------------------------------------------------------
# plots


def plots(results: dict[str, Any], outdir: Path) -> list[str]:
    """PNG files (names) of the scenarios in ``results``, written into ``outdir``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for name, res in results.get("scenarios", {}).items():
        fn = PLOTS.get(name)
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


def _bars(ax: Any, groups: list[str], series: dict[str, list[float]], ylabel: str) -> None:
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
    ax.set_ylabel(ylabel)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)


def _plot_passthrough(plt: Any, res: dict[str, Any]) -> Any:
    configs = res["config"].get("configs", ["direct", "relay", "kshare"])
    rows = res["rows"]
    fig, ax = plt.subplots(figsize=(8, 4))
    groups = [f"{r['workload']} {_size(r['value_size'])}" for r in rows]
    _bars(ax, groups, {c: [r.get(f"{c}_rps") for r in rows] for c in configs}, "records/s")
    ax.set_title("pass-through: records/s (medians)", fontsize=10)
    return fig


def _plot_share(plt: Any, res: dict[str, Any]) -> Any:
    configs = res["config"].get("configs", ["classic", "kshare", "native"])
    rows = res["rows"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    groups = [f"{_size(r['value_size'])} x{r['partitions']}" for r in rows]
    _bars(
        ax1,
        groups,
        {c: [r.get(f"{c}_rps") for r in rows] for c in configs},
        "records/s (first -> last record)",
    )
    ax1.set_title("one consumer: steady rate", fontsize=10)
    _bars(ax2, groups, {c: [r.get(f"{c}_first_s") for r in rows] for c in configs}, "seconds")
    ax2.set_title("time to the first record (join included)", fontsize=10)
    return fig


def _plot_scaling(plt: Any, res: dict[str, Any]) -> Any:
    rows = res["rows"]
    parts = sorted({r["partitions"] for r in rows})
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    styles = {1: "-", 4: "--"}
    for p in parts:
        rs = sorted((r for r in rows if r["partitions"] == p), key=lambda r: r["consumers"])
        if len(rs) < 3:  # a mix: points only
            for r in rs:
                for name in ("kshare", "native"):
                    ax.plot([r["consumers"]], [r.get(f"{name}_rps")], "o", color=COLORS[name], mfc="none")
                ax.annotate(
                    f"{r['consumers']} on {p}", (r["consumers"], r.get("kshare_rps") or 0), fontsize=7
                )
            continue
        xs = [r["consumers"] for r in rs]
        for name in ("kshare", "native"):
            ax.plot(
                xs,
                [r.get(f"{name}_rps") for r in rs],
                styles.get(p, "-."),
                marker="o",
                color=COLORS[name],
                label=f"{name}, {p} partition(s)",
            )
    all_x = sorted({r["consumers"] for r in rows})
    ax.plot(
        all_x,
        [x * 1000 / res["config"].get("work_ms", 5.0) for x in all_x],
        color="black",
        lw=0.8,
        alpha=0.6,
        label="ideal (N x 200 rec/s)",
    )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("consumers")
    ax.set_ylabel("records/s while all are busy")
    ax.set_title("scaling with 5 ms of work per record", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    groups = [f"{r['consumers']}/{r['partitions']}" for r in rows]
    _bars(
        ax2,
        groups,
        {n: [100 * (r.get(f"{n}_of_ideal") or 0) for r in rows] for n in ("kshare", "native")},
        "% of the ideal rate",
    )
    ax2.axhline(100, color="black", lw=0.8, alpha=0.6)
    ax2.set_xlabel("consumers / partitions")
    ax2.set_title("share of the ideal N x 200 records/s", fontsize=10)
    return fig


def _plot_latency(plt: Any, res: dict[str, Any]) -> Any:
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for r in res["rows"]:
        q = r.get("quantiles_ms") or []
        if q:
            ax1.plot(
                q, [(i + 1) / len(q) for i in range(len(q))], color=COLORS.get(r["system"]), label=r["system"]
            )
        tail = r.get("tail_ms") or []
        if tail:
            ax2.plot(
                [10 ** -(k / 4) for k in range(8, 8 + len(tail))],
                tail,
                marker="o",
                color=COLORS.get(r["system"]),
                label=r["system"],
            )
    ax1.set_xscale("log")
    ax1.set_xlabel("end-to-end latency (ms)")
    ax1.set_ylabel("fraction of records")
    ax1.set_title(f"CDF at {res['config'].get('rate', 0):,.0f} records/s", fontsize=10)
    ax1.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=8)
    ax2.set_xscale("log")
    ax2.invert_xaxis()
    ax2.set_yscale("log")
    ax2.set_xlabel("fraction of records slower (1 - quantile)")
    ax2.set_ylabel("latency (ms)")
    ax2.set_title("tail: p99 (0.01) ... p99.99 (0.0001)", fontsize=10)
    ax2.grid(True, which="both", alpha=0.3)
    ax2.legend(fontsize=8)
    return fig


def _plot_ack(plt: Any, res: dict[str, Any]) -> Any:
    rows = res["rows"]
    loads = sorted({r.get("rate", 0.0) for r in rows})
    target_load = max(loads) if loads else 0.0  # the paced load where there is one (scenarios.ack)
    fig, axes = plt.subplots(1, len(loads), figsize=(6 * len(loads), 4), squeeze=False)
    for ax, rate in zip(axes[0], loads, strict=True):
        for system in ("kshare", "native"):
            rs = [r for r in rows if r.get("system", "kshare") == system and r.get("rate", 0.0) == rate]
            if not rs:
                continue
            xs = [r["members"] for r in rs]
            color = COLORS.get(system, None)
            ax.plot(xs, [r["p50_ms"] for r in rs], "o-", color=color, label=f"{system} p50")
            ax.plot(xs, [r["p99_ms"] for r in rs], "o--", color=color, alpha=0.5, label=f"{system} p99")
        one = next((r["p50_ms"] for r in rows if r.get("system", "kshare") == "kshare"
                    and r.get("rate", 0.0) == rate and r["members"] == 1), None)
        if one and rate == target_load:
            ax.axhline(2 * one, color="tab:red", lw=0.8, ls=":", label="target: 2 x kshare p50 of one member")
        ax.set_title("closed loop" if not rate else f"{rate:,.0f} cycles/s shared by the members", fontsize=10)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("concurrent members")
        ax.set_ylabel("ShareAcknowledge round trip (ms)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _plot_memory(plt: Any, res: dict[str, Any]) -> Any:
    r = res["rows"][0]
    fig, ax = plt.subplots(figsize=(7, 4))
    labels = ["idle", "peak", "loaded", "members left"]
    values = [r["rss_idle_mb"], r["rss_peak_mb"], r["rss_loaded_mb"], r["rss_after_close_mb"]]
    ax.bar(labels, values, color=COLORS["kshare"], label="proxy RSS")
    ax.bar(
        ["loaded"],
        [r["record_cache_mb"] or 0],
        color="tab:purple",
        width=0.4,
        label="kshare_record_cache_bytes",
    )
    ax.axhline(r["rss_limit_mb"], color="tab:red", ls=":", lw=1, label="idle + cache budget + fixed overhead")
    ax.set_ylabel("MB")
    ax.set_title(
        f"{r['share_partitions_touched']:,} share-partitions, {r['connections']:,} connections", fontsize=10
    )
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def _plot_cpu(plt: Any, res: dict[str, Any]) -> Any:
    rows = res["rows"]
    fig, ax = plt.subplots(figsize=(8, 4))
    labels = [f"{r['workload']}\n{_size(r['value_size'])}" for r in rows]
    ax.bar(range(len(rows)), [r["mcores_per_mbps"] for r in rows], color=COLORS["kshare"])
    ax.axhline(35, color="tab:red", ls=":", lw=1, label="target 35")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("millicores per MB/s")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def _log_label(y: float, _: Any = None) -> str:
    """A log axis' tick as a plain number, at 1, 2 and 5 times a power of ten only."""
    if y <= 0:
        return ""
    mantissa = y / 10 ** math.floor(math.log10(y) + 1e-9)
    return f"{y:g}" if any(abs(mantissa - m) < 1e-6 for m in (1, 2, 5)) else ""


def _plot_embedded(plt: Any, res: dict[str, Any]) -> Any:
    from matplotlib import ticker

    cfg = res.get("config", {})
    window = cfg.get("window_s", 10)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4), gridspec_kw={"width_ratios": [2, 2, 1]})
    for ax, key, title, limit, what in (
        (axes[0], "p50_ms", f"median of each {window:g} s", 3.0, "every window's median"),
        (axes[1], "p99_ms", f"p99 of each {window:g} s", 25.0, "the p99 over the run"),
    ):
        for r in res["rows"]:
            ws = r.get("windows") or []
            ax.plot([w["start_s"] + window / 2 for w in ws], [w[key] for w in ws], marker=".",
                    color=COLORS.get(r["system"]), label=r["system"])
        ax.axhline(limit, color="tab:red", ls=":", lw=1, label=f"kshare's target: {what} <= {limit:g} ms")
        ax.axvspan(-cfg.get("warmup_s", 0), 0, color="gray", alpha=0.15, label="warm-up (left out)")
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(_log_label))
        ax.yaxis.set_minor_formatter(ticker.FuncFormatter(_log_label))
        ax.tick_params(axis="y", which="minor", labelsize=7)
        ax.set_xlabel("seconds of send time after the warm-up")
        ax.set_ylabel("end-to-end latency (ms)")
        ax.set_title(f"{title} at {cfg.get('rate', 0):,.0f} records/s", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    starts = res.get("starts") or []
    axes[2].bar(range(len(starts)), [st.get("ready_s") or 0 for st in starts],
                color=["tab:orange"] + [COLORS["kshare"]] * (len(starts) - 1))
    axes[2].set_xticks(range(len(starts)))
    axes[2].set_xticklabels(["first\n(download)" if i == 0 else f"restart\n{i}" for i in range(len(starts))],
                            fontsize=8)
    axes[2].set_ylabel("seconds to /ready 200")
    axes[2].set_title("kshare proxy, no --upstream: time to ready", fontsize=9)
    axes[2].grid(True, axis="y", alpha=0.3)
    return fig


def _plot_spark(plt: Any, res: dict[str, Any]) -> Any:
    rows = res["rows"]
    cfg = res.get("config", {})
    pairs = [tuple(p) for p in cfg.get("pairs", [])]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    groups = [f"{p} partition(s), {t} tasks" for p, t in pairs]
    kinds = list(dict.fromkeys(r["kind"] for r in rows if (r["partitions"], r["tasks"]) in pairs))
    by = {(r["kind"], r["partitions"], r["tasks"]): r for r in rows}
    _bars(ax, groups, {k: [by.get((k, p, t), {}).get("records_per_s") for p, t in pairs] for k in kinds},
          "records/s (steady)")
    for i, (_, t) in enumerate(pairs):
        ax.plot([i - 0.45, i + 0.45], [t * 1000 / cfg.get("work_ms", 5.0)] * 2, color="black", lw=0.8, alpha=0.6)
    ax.set_title("side by side (black: the ideal, tasks x 200 rec/s)", fontsize=10)
    _bars(ax2, groups, {k: [by.get((k, p, t), {}).get("overhead_ms") for p, t in pairs] for k in kinds},
          "overhead per micro-batch, ms")
    ax2.set_title("micro-batch time - rows x 5 ms / tasks", fontsize=10)
    return fig


def _plot_failover(plt: Any, res: dict[str, Any]) -> Any:
    rows = res["rows"]
    fig, axes = plt.subplots(len(rows), 1, figsize=(12, 3.2 * len(rows)), squeeze=False)
    for ax, r in zip(axes[:, 0], rows, strict=True):
        tl = r.get("timeline") or {}
        for key, color, label in (("deliveries", COLORS.get(r["system"]), "deliveries/s"),
                                  ("redeliveries", "tab:red", "of them redeliveries"),
                                  ("produced", "tab:gray", "records produced/s (acknowledged)")):
            ys = tl.get(key, [])
            ax.plot(range(len(ys)), ys, color=color, lw=1, label=label)
        for i, f in enumerate(r.get("faults_at_s", [])):
            ax.axvspan(f["signal_s"], f["back_s"], color="tab:orange", alpha=0.2,
                       label="broker down (signal to back in the metadata)" if i == 0 else None)
            ax.text(f["signal_s"], ax.get_ylim()[1] * 0.95, f["fault"], fontsize=7, va="top", rotation=90)
        ax.set_xlabel("seconds after the consumers started")
        ax.set_ylabel("records / s")
        ax.set_title(f"{_FAILOVER_NAMES.get(r['system'], r['system'])}: {_num(r.get('roll_redelivered_pct'), 1)} % "
                     f"redelivered over the faults, longest stall {_num(r.get('longest_stall_s'), 1)} s, "
                     f"{_num(r.get('lost'))} lost", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    return fig


PLOTS = {
    "passthrough": _plot_passthrough,
    "share": _plot_share,
    "scaling": _plot_scaling,
    "latency": _plot_latency,
    "ack": _plot_ack,
    "memory": _plot_memory,
    "cpu": _plot_cpu,
    "embedded": _plot_embedded,
    "spark": _plot_spark,
    "failover": _plot_failover,
}


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


# -- the aioconsumer scenario (kshare/bench/aioconsumer.py) ----------------------------------------


def _aioconsumer(res: dict[str, Any]) -> list[str]:
    from .aioconsumer import section

    return section(res)


def _plot_aioconsumer(plt: Any, res: dict[str, Any]) -> Any:
    from .aioconsumer import plot

    return plot(plt, res)


TITLES["aioconsumer"] = "kshare.AIOShareConsumer vs confluent-kafka's ShareConsumer: one consumer's records/s"
SECTIONS["aioconsumer"] = _aioconsumer
PLOTS["aioconsumer"] = _plot_aioconsumer
