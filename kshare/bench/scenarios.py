"""The scenarios of ``kshare bench``. Each takes the :class:`~kshare.bench.runner.Env` (brokers, relay and
proxy, started on first use), the sizes of this run and a progress reporter, and returns a JSON-able
dict: ``config`` (what was run), ``rows`` (medians, one dict per table row), ``samples`` (every
measured run) and ``targets`` (the issue's target ratios, each met or not).

Every scenario alternates its configurations over the repeats (A B C, C B A, A B C, ...) after an
untimed warm-up, so that a machine whose load changes during the run biases none of them, and
reports medians.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import multiprocessing as mp
import queue
import random
import re
import shlex
import shutil
import statistics
import struct
import threading
import time
import urllib.request
import uuid
from array import array
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import clients
from .aioconsumer import aioconsumer  # noqa: F401 - the aioconsumer scenario (issue 43)
from .procs import ProxyProcess, cpu_seconds, load, rss_bytes

if TYPE_CHECKING:
    from .runner import Env, Progress

SCENARIOS = ("passthrough", "share", "scaling", "latency", "ack", "cpu", "memory", "embedded", "spark", "failover")
# run only when named (--only): kshare on its embedded broker takes 25 minutes of its own, the Spark
# sources about 25 (and need pyspark, and Spark's Kafka source from Maven Central), the failover runs
# about 7 (two three-node clusters of their own, one after the other)
OPT_IN = ("embedded", "spark", "failover")

# the issue's targets
PASSTHROUGH_TARGET = 0.95  # kshare / relay
SHARE_TARGET = 1.0  # kshare / native Kafka 4.4, first record -> last
ACK_TARGET = 2.0  # p50 with 16 concurrent members / p50 with one
LATENCY_TARGET_MS = 2.0  # kshare p99 - direct p99
CPU_TARGET = 35.0  # proxy millicores per MB/s
FULL_BATCHES_LINGER_MS = 1000  # the share scenario's producer: batches cut by size alone
MEMORY_OVERHEAD_MB = 200  # RSS may exceed the idle proxy's by the record-cache budget plus this
DEFAULT_CACHE_MB = 256  # kshare proxy --record-cache-mb's default
EMBEDDED_WINDOW_P50_MS = 3.0  # kshare on its embedded broker: every 10 s window's median
EMBEDDED_P99_MS = 25.0  # kshare on its embedded broker: p99 over the run
SPARK_RATE_TARGET = 0.9  # the kshare source's records/s / Spark's Kafka source's (issue 38)
SPARK_OVERHEAD_TARGET_MS = 200.0  # the kshare source's overhead per micro-batch - the Kafka source's
# kshare.AIOShareConsumer against confluent's ShareConsumer (kshare/bench/aioconsumer.py, issue 43): run only
# when named, one figure for the docs rather than a regression watch
SCENARIOS += ("aioconsumer",)
OPT_IN += ("aioconsumer",)


def _size(b: int) -> str:
    return "1 KiB" if b == 1024 else f"{b} B"


def alternate(configs: list[str], repeat: int) -> list[str]:
    """The order of ``configs`` in round ``repeat``: forwards, backwards, forwards..."""
    return list(configs) if repeat % 2 == 0 else list(reversed(configs))


def median(xs: list[float]) -> float:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return statistics.median(xs) if xs else float("nan")


def target(name: str, value: float, threshold: float, op: str, unit: str = "") -> dict[str, Any]:
    met = (value >= threshold if op == ">=" else value <= threshold) if not math.isnan(value) else False
    return {"name": name, "value": value, "threshold": threshold, "op": op, "unit": unit, "met": bool(met)}


def per_round(a_secs: list[float], b_secs: list[float]) -> float:
    """The median over rounds of b's time / a's time (a's rate / b's rate) for runs of one round
    taken side by side: beside the ratio of the medians, a figure a slow spell of the machine
    that fell on a few runs of one configuration moves less."""
    return median([b / a for a, b in zip(a_secs, b_secs, strict=False) if a and b])


def pct(sorted_xs: list[float] | array, q: float) -> float:
    if not sorted_xs:
        return float("nan")
    return sorted_xs[min(len(sorted_xs) - 1, max(0, math.ceil(q * len(sorted_xs)) - 1))]


# --------------------------------------------------------------------------------------------
# 1. pass-through produce and consume: direct, bare relay, kshare


def passthrough(
    env: Env,
    progress: Progress,
    *,
    records: dict[int, int],
    repeats: int,
    partitions: int = 4,
    configs: list[str] | None = None,
    warmup: bool = True,
) -> dict[str, Any]:
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
                        f"pass-through {kind} {_size(size)}: kshare / relay",
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


# --------------------------------------------------------------------------------------------
# 2. one share consumer: kshare (on 3.9) vs native 4.4 vs a classic consumer direct on 3.9


def share(
    env: Env,
    progress: Progress,
    *,
    records: dict[int, int],
    partition_counts: list[int],
    repeats: int,
    configs: list[str] | None = None,
    warmup: int = 1,
) -> dict[str, Any]:
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
    budget_mb = _cache_budget_mb(env.proxy_args, DEFAULT_CACHE_MB)
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
                    f"share consumer {_size(size)}, {parts} partition(s): kshare / native",
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


# --------------------------------------------------------------------------------------------
# 3. scaling past partitions: N consumers with 5 ms of work per record


def _scale_member(
    bootstrap: str,
    group: str,
    topic: str,
    work_s: float,
    max_poll: int,
    ready: threading.Semaphore,
    start: threading.Event,
    stop: threading.Event,
    times: list[float],
    errors: list[str],
) -> None:
    from confluent_kafka import ShareConsumer

    try:
        c = ShareConsumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "max.poll.records": max_poll,
                "error_cb": clients._quiet,
                "log_level": 3,
            }
        )
        c.subscribe([topic])
    except Exception as exc:  # noqa: BLE001
        errors.append(repr(exc))
        ready.release()
        return
    ready.release()
    start.wait()
    try:
        while not stop.is_set():
            for m in c.poll(0.1):
                if m.error() is not None:
                    continue
                time.sleep(work_s)
                times.append(time.monotonic())
    finally:
        with contextlib.suppress(Exception):
            c.close()


def _scale_run(
    bootstrap: str,
    admin_bootstrap: str,
    consumers: int,
    partitions: int,
    seconds: float,
    work_ms: float,
    max_poll: int,
) -> dict[str, Any]:
    from confluent_kafka import Producer

    rate = 1000 / work_ms
    total = int(consumers * rate * seconds)
    topic = clients.create_topic(
        admin_bootstrap, f"bench-scale-{consumers}-{uuid.uuid4().hex[:8]}", partitions
    )
    group = f"bench-scale-{uuid.uuid4().hex[:8]}"
    try:
        # one record per producer batch: share fetches acquire whole batches
        p = Producer(
            {
                "bootstrap.servers": admin_bootstrap,
                "linger.ms": 5,
                "batch.num.messages": 1,
                "queue.buffering.max.messages": 1_000_000,
                "error_cb": clients._quiet,
                "log_level": 3,
            }
        )
        value = b"." * 100
        for i in range(total):
            while True:
                try:
                    p.produce(topic, value, partition=i % partitions)
                    break
                except BufferError:
                    p.poll(0.05)
        assert p.flush(120) == 0
        clients.share_group(bootstrap, group)
        ready, start, stop = threading.Semaphore(0), threading.Event(), threading.Event()
        times: list[list[float]] = [[] for _ in range(consumers)]
        errors: list[str] = []
        threads = [
            threading.Thread(
                target=_scale_member,
                args=(
                    bootstrap,
                    group,
                    topic,
                    work_ms / 1000,
                    max_poll,
                    ready,
                    start,
                    stop,
                    times[i],
                    errors,
                ),
                daemon=True,
            )
            for i in range(consumers)
        ]
        for t in threads:
            t.start()
        for _ in threads:
            if not ready.acquire(timeout=120):
                raise TimeoutError("a consumer did not start")
        if errors:
            raise RuntimeError(f"consumer errors: {errors[:3]}")
        start.set()
        deadline = time.monotonic() + seconds * 4 + 60
        while sum(len(t) for t in times) < total and time.monotonic() < deadline:
            time.sleep(0.2)
        stop.set()
        for t in threads:
            t.join(30)
    finally:
        clients.delete_topic(admin_bootstrap, topic)
    got = sum(len(t) for t in times)
    busy = [t for t in times if t]
    window = float("nan")
    if busy:
        w0 = max(t[0] for t in busy)
        w1 = min(t[-1] for t in busy)
        inside = sum(1 for t in busy for x in t if w0 < x <= w1)
        if w1 - w0 > 0.5:
            window = inside / (w1 - w0)
    everything = sorted(x for t in busy for x in t)
    overall = (
        (len(everything) - 1) / (everything[-1] - everything[0]) if len(everything) > 1 else float("nan")
    )
    return {
        "consumers": consumers,
        "partitions": partitions,
        "records": total,
        "delivered": got,
        "busy_consumers": len(busy),
        "all_busy_rps": window,
        "overall_rps": overall,
        "ideal_rps": consumers * rate,
        "per_consumer": sorted(len(t) for t in times),
    }


def scaling(
    env: Env,
    progress: Progress,
    *,
    points: list[tuple[int, int]],
    seconds: float,
    repeats: int,
    work_ms: float = 5.0,
    max_poll: int = 25,
) -> dict[str, Any]:
    proxy = env.proxy()
    k4 = env.kafka4()
    systems = {"kshare": (proxy.bootstrap, env.upstream()), "native": (k4, k4)}
    progress.begin("scaling", len(points) * repeats * len(systems))
    samples = []
    for consumers, partitions in points:
        for r in range(repeats):
            for name in alternate(list(systems), r + (consumers + partitions) % 2):
                bootstrap, admin_bootstrap = systems[name]
                s = _scale_run(bootstrap, admin_bootstrap, consumers, partitions, seconds, work_ms, max_poll)
                s["system"] = name
                samples.append(s)
                rate = s["all_busy_rps"] if not math.isnan(s["all_busy_rps"]) else s["overall_rps"]
                progress.step(
                    f"{name} {consumers} on {partitions}: {rate:,.0f} rec/s "
                    f"({rate / s['ideal_rps']:.0%} of ideal), {s['busy_consumers']} busy"
                )
    rows = []
    for consumers, partitions in points:
        row: dict[str, Any] = {
            "consumers": consumers,
            "partitions": partitions,
            "ideal_rps": consumers * 1000 / work_ms,
        }
        for name in systems:
            ss = [
                s
                for s in samples
                if s["system"] == name and s["consumers"] == consumers and s["partitions"] == partitions
            ]
            rate = median(
                [s["all_busy_rps"] if not math.isnan(s["all_busy_rps"]) else s["overall_rps"] for s in ss]
            )
            row[f"{name}_rps"] = rate
            row[f"{name}_of_ideal"] = rate / row["ideal_rps"]
            row[f"{name}_busy"] = min(s["busy_consumers"] for s in ss)
        rows.append(row)
    progress.end()
    return {
        "config": {
            "points": points,
            "seconds": seconds,
            "work_ms": work_ms,
            "max_poll_records": max_poll,
            "repeats": repeats,
        },
        "rows": rows,
        "samples": samples,
        "targets": [],
    }


# --------------------------------------------------------------------------------------------
# 4. end-to-end latency at a fixed rate

_VALUE = struct.Struct(">qq")  # sequence number (-1: probe), send time (ns, CLOCK_MONOTONIC)


def _latency_producer(
    bootstrap: str, topic: str, rate: float, seconds: float, size: int, go, t0, out, linger_ms: int = 5
) -> None:
    """Probes every 50 ms until ``go``; then ``rate`` records a second from ``t0`` for ``seconds``."""
    from confluent_kafka import Producer

    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            # 5: librdkafka's default. With 0, each record was a Produce request of its own: 5,000 a
            # second kept the broker at 80 % of a core here, and the direct consumer's own p99
            # swung between 180 and 380 ms, hiding what the proxy adds (6 ms with 5).
            "linger.ms": linger_ms,
            "acks": "all",
            "error_cb": clients._quiet,
            "log_level": 3,
        }
    )
    pad = b"." * max(0, size - _VALUE.size)
    while not go.is_set():
        p.produce(topic, _VALUE.pack(-1, time.monotonic_ns()) + pad, partition=0)
        p.poll(0)
        go.wait(0.05)
    start = t0.value
    total = int(rate * seconds)
    lag_max = 0.0
    i = 0
    stop_at = start + seconds + 30
    while i < total and time.monotonic() < stop_at:
        due = start + i / rate
        now = time.monotonic()
        if now < due:
            time.sleep(due - now)
        else:
            lag_max = max(lag_max, now - due)
        try:
            p.produce(topic, _VALUE.pack(i, time.monotonic_ns()) + pad, partition=0)
        except BufferError:
            p.poll(0.01)
            continue
        i += 1
        p.poll(0)
    left = p.flush(30)
    out.put(("produced", i, lag_max, left))


def _latency_consumer(kind: str, bootstrap: str, topic: str, group: str, ready, stop, out) -> None:
    """Until ``stop``: latency (ms, receive - send) of every record; ``ready`` at the first probe."""
    if kind == "share":
        from confluent_kafka import ShareConsumer

        c = ShareConsumer(
            {"bootstrap.servers": bootstrap, "group.id": group, "error_cb": clients._quiet, "log_level": 3}
        )

        def poll():
            return c.poll(0.1)
    else:
        from confluent_kafka import Consumer

        c = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 100,
                "error_cb": clients._quiet,
                "log_level": 3,
            }
        )

        def poll():  # one at a time: consume(n, timeout) would wait for n records or the timeout
            m = c.poll(0.1)
            return () if m is None else (m,)

    c.subscribe([topic])
    seqs = array("q")
    lat = array("d")
    unpack = _VALUE.unpack_from
    try:
        while not stop.is_set():
            msgs = poll()
            now = time.monotonic_ns()
            for m in msgs:
                if m.error() is not None:
                    continue
                seq, ns = unpack(m.value())
                if seq < 0:
                    ready.set()
                    continue
                seqs.append(seq)
                lat.append((now - ns) / 1e6)
    finally:
        with contextlib.suppress(Exception):
            c.close()
        out.put(("consumed", seqs.tobytes(), lat.tobytes()))


def _latency_run(
    system: str,
    bootstrap: str,
    admin_bootstrap: str,
    rate: float,
    seconds: float,
    size: int,
    skip_s: float,
    window_s: float = 0.0,
    linger_ms: int = 5,
) -> dict[str, Any]:
    """One producer and one consumer for ``seconds``; the records of the first ``skip_s`` are left out
    of the figures. With ``window_s``: also ``windows``, the figures of every ``window_s`` of send
    time (record ``i`` was due at ``i / rate``), counted from the end of ``skip_s`` (the skipped
    records' windows come first, ``warmup`` true)."""
    ctx = mp.get_context("spawn")
    topic = clients.create_topic(admin_bootstrap, f"bench-latency-{system}-{uuid.uuid4().hex[:8]}", 1)
    group = f"bench-latency-{uuid.uuid4().hex[:8]}"
    kind = "classic" if system == "direct" else "share"
    if kind == "share":
        clients.share_group(bootstrap, group)
    go, ready, stop = ctx.Event(), ctx.Event(), ctx.Event()
    t0 = ctx.Value("d", 0.0)
    out = ctx.Queue()
    procs = [
        ctx.Process(
            target=_latency_consumer, args=(kind, bootstrap, topic, group, ready, stop, out), daemon=True
        ),
        ctx.Process(
            target=_latency_producer,
            args=(bootstrap, topic, rate, seconds, size, go, t0, out, linger_ms),
            daemon=True,
        ),
    ]
    try:
        for pr in procs:
            pr.start()
        if not ready.wait(180):
            raise TimeoutError(f"{system}: the consumer got no record in 180 s")
        t0.value = time.monotonic() + 0.5
        go.set()
        produced = None
        deadline = time.monotonic() + seconds + 120
        while produced is None:
            try:
                msg = out.get(timeout=1.0)
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{system}: the producer did not finish") from None
                continue
            if msg[0] == "produced":
                produced = msg
        time.sleep(2.0)  # the last records arrive
        stop.set()
        msg = out.get(timeout=60)
    finally:
        stop.set()
        for pr in procs:
            pr.join(15)
            if pr.is_alive():
                pr.kill()
        clients.delete_topic(admin_bootstrap, topic)
    seqs, lat = array("q"), array("d")
    seqs.frombytes(msg[1])
    lat.frombytes(msg[2])
    skip = int(rate * skip_s)  # the first records: the consumer's fetch loop settles
    measured = sorted(x for s, x in zip(seqs, lat, strict=True) if s >= skip)
    sent = produced[1]
    windows = _windows(seqs, lat, rate, skip, window_s) if window_s else None
    return {
        **({"windows": windows} if windows is not None else {}),
        "system": system,
        "sent": sent,
        "received": len(set(seqs)),
        "duplicates": len(seqs) - len(set(seqs)),
        "producer_lag_max_ms": produced[2] * 1000,
        "measured": len(measured),
        "p50_ms": pct(measured, 0.5),
        "p99_ms": pct(measured, 0.99),
        "p999_ms": pct(measured, 0.999),
        "max_ms": measured[-1] if measured else float("nan"),
        # 201 quantiles (0, 0.5 %, ... 100 %) and the tail, for the plot
        "quantiles_ms": [pct(measured, q / 200) for q in range(1, 201)] if measured else [],
        "tail_ms": [pct(measured, 1 - 10 ** -(k / 4)) for k in range(8, 17)] if measured else [],
    }


def _windows(seqs: array, lat: array, rate: float, skip: int, window_s: float) -> list[dict[str, Any]]:
    """p50 / p99 / max of each ``window_s`` of send time from record ``skip`` on (before it: the
    warm-up's windows, negative ``start_s``), and how many records it got (duplicates included)."""
    per = max(1, round(rate * window_s))
    buckets: dict[int, list[float]] = {}
    for seq, x in zip(seqs, lat, strict=True):
        buckets.setdefault((seq - skip) // per, []).append(x)
    out = []
    for w in sorted(buckets):
        xs = sorted(buckets[w])
        out.append(
            {
                "start_s": w * window_s,
                "received": len(xs),
                "p50_ms": pct(xs, 0.5),
                "p99_ms": pct(xs, 0.99),
                "max_ms": xs[-1],
                "warmup": w < 0,
            }
        )
    return out


def latency(
    env: Env,
    progress: Progress,
    *,
    rate: float,
    seconds: float,
    repeats: int,
    size: int = 100,
    warmup_s: float = 5.0,
) -> dict[str, Any]:
    proxy = env.proxy()
    k4 = env.kafka4()
    systems = {
        "direct": (env.upstream(), env.upstream()),
        "kshare": (proxy.bootstrap, env.upstream()),
        "native": (k4, k4),
    }
    progress.begin("latency", len(systems) * (repeats + (1 if warmup_s else 0)))
    samples = []
    if warmup_s:
        for name, (bootstrap, admin_bootstrap) in systems.items():
            s = _latency_run(name, bootstrap, admin_bootstrap, rate, warmup_s, size, 0.0)
            progress.step(f"warm-up {name}: p99 {s['p99_ms']:.2f} ms")
    for r in range(repeats):
        for name in alternate(list(systems), r):
            bootstrap, admin_bootstrap = systems[name]
            s = _latency_run(name, bootstrap, admin_bootstrap, rate, seconds, size, min(1.0, seconds / 5))
            samples.append(s)
            progress.step(
                f"{name}: p50 {s['p50_ms']:.2f} p99 {s['p99_ms']:.2f} p99.9 {s['p999_ms']:.2f} ms, "
                f"{s['received']:,}/{s['sent']:,} received"
            )
    rows = []
    for name in systems:
        ss = [s for s in samples if s["system"] == name]
        best = min(ss, key=lambda s: abs(s["p99_ms"] - median([x["p99_ms"] for x in ss])))
        rows.append(
            {
                "system": name,
                "p50_ms": median([s["p50_ms"] for s in ss]),
                "p99_ms": median([s["p99_ms"] for s in ss]),
                "p999_ms": median([s["p999_ms"] for s in ss]),
                "max_ms": max(s["max_ms"] for s in ss),
                "sent": sum(s["sent"] for s in ss),
                "received": sum(s["received"] for s in ss),
                "duplicates": sum(s["duplicates"] for s in ss),
                "quantiles_ms": best["quantiles_ms"],
                "tail_ms": best["tail_ms"],
            }
        )
    by = {r["system"]: r for r in rows}
    added = by["kshare"]["p99_ms"] - by["direct"]["p99_ms"]
    progress.end()
    return {
        "config": {
            "rate": rate,
            "seconds": seconds,
            "value_size": size,
            "repeats": repeats,
            "warmup_s": warmup_s,
        },
        "rows": rows,
        "samples": [{k: v for k, v in s.items() if k not in ("quantiles_ms", "tail_ms")} for s in samples],
        "targets": [
            target(
                f"added p99 latency at {rate:,.0f} records/s: kshare p99 - direct p99",
                added,
                LATENCY_TARGET_MS,
                "<=",
                "ms",
            )
        ],
    }


# --------------------------------------------------------------------------------------------
# 4b. kshare on its embedded broker (no --upstream): latency over time beside native Kafka 4.4,
# and the time from the start of ``kshare proxy`` to ready, the first time (jars fetched) and later


def _files_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def _embedded_proxy(env: Env, cache: Path, data: Path, timeout: float) -> tuple[ProxyProcess, dict[str, Any]]:
    """``kshare proxy --embedded kafka --data-dir DATA`` (no ``--upstream``) with ``KSHARE_CACHE=CACHE``,
    started; with the seconds from the start of the process to the first 200 of ``/ready`` on its
    metrics port (polled every 20 ms) and what its log says of the broker it started."""
    proxy = ProxyProcess(
        None,
        ["--embedded", "kafka", "--data-dir", str(data), *env.proxy_args],
        name="kshare-embedded",
        log_path=env.options.out / "kshare-embedded.log",
        env={"KSHARE_CACHE": str(cache)},
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: no HTTP proxy
    url = f"http://127.0.0.1:{proxy.metrics_port}/ready"
    ready_at: list[float] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            with contextlib.suppress(OSError):  # refused (not listening yet) or 503 (an HTTPError)
                with opener.open(url, timeout=5) as answer:
                    if answer.status == 200:
                        ready_at.append(time.monotonic())
                        return
            done.wait(0.02)

    poller = threading.Thread(target=poll, name="ready-poll", daemon=True)
    t0 = time.monotonic()
    poller.start()
    try:
        proxy.start(timeout)  # returns at the log line "share state loaded"
        logged = time.monotonic() - t0
        poller.join(60)
    except BaseException:
        proxy.stop()
        raise
    finally:
        done.set()
    if not ready_at:
        proxy.stop()
        raise RuntimeError(f"/ready of the embedded kshare proxy did not answer 200 within 60 s of its log "
                           f"saying the share state is loaded:\n{''.join(proxy.output[-30:])}")
    text = "".join(proxy.output)
    started = re.search(r"started the embedded (.+?) at (\S+) in ([\d.]+) s", text)
    fetched = re.search(r"fetching Apache Kafka \S+ for the embedded broker: (\d+) jars, (\d+) MB", text)
    return proxy, {
        "ready_s": ready_at[0] - t0,
        "logged_ready_s": logged,
        "broker": started[1] if started else None,
        "broker_bootstrap": started[2] if started else None,
        "broker_start_s": float(started[3]) if started else float("nan"),
        "fetched_jars": int(fetched[1]) if fetched else 0,
        "fetched_mb": float(fetched[2]) if fetched else 0.0,
    }


def embedded(
    env: Env,
    progress: Progress,
    *,
    rate: float,
    seconds: float,
    warmup_s: float,
    window_s: float = 10.0,
    restarts: int = 3,
    size: int = 100,
    linger_ms: int = 5,
    start_timeout: float = 900.0,
) -> dict[str, Any]:
    """``kshare proxy`` with no ``--upstream`` (``--embedded kafka``, a fresh ``--data-dir`` and an empty
    ``KSHARE_CACHE`` in the results folder): its time to ready, the first time (the jars fetched) and
    after ``restarts`` restarts; then end-to-end latency at ``rate`` for ``warmup_s + seconds``
    through it (the last restart's proxy), and the same on native Kafka 4.4 share groups, one after
    the other; every ``window_s`` of the measured ``seconds`` gets its p50 and p99."""
    # absolute: the embedded broker runs in its data dir, where a relative --data-dir would not be found
    root = env.options.out.resolve() / "embedded"
    cache, data = root / "cache", root / "data"
    for d in (cache, data):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    progress.begin("embedded", 1 + restarts + 2)
    starts: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    notes: list[str] = []
    proxy: ProxyProcess | None = None
    command = ""
    total_s = warmup_s + seconds

    def done(s: dict[str, Any]) -> None:
        samples.append(s)
        progress.step(
            f"{s['system']}: p50 {s['p50_ms']:.2f} p99 {s['p99_ms']:.2f} ms, window p50 up to "
            f"{max((w['p50_ms'] for w in s['windows'] if not w['warmup']), default=float('nan')):.2f} ms, "
            f"{s['received']:,}/{s['sent']:,} received"
        )

    try:
        for i in range(1 + restarts):
            if proxy is not None:
                proxy.stop()
                notes += proxy.notes()
                proxy = None
            proxy, st = _embedded_proxy(env, cache, data, start_timeout)
            if i == 0:
                command = "KSHARE_CACHE=" + shlex.join([str(cache), "kshare", *proxy.cmd[3:]])
                st["cache_mb"] = round(_files_bytes(cache) / 1e6, 1)
            st["run"] = "first (empty cache, empty data dir)" if i == 0 else f"restart {i}"
            starts.append(st)
            progress.step(
                f"{st['run']}: ready in {st['ready_s']:.2f} s (embedded broker up in {st['broker_start_s']:.1f} s"
                + (f", {st['fetched_jars']} jars, {st['fetched_mb']:.0f} MB fetched)" if st["fetched_jars"] else ")")
            )
        assert proxy is not None
        env.started["kshare-embedded"] = (
            f"kshare proxy (no --upstream) at {proxy.bootstrap} on the embedded "
            f"{starts[-1]['broker']} at {starts[-1]['broker_bootstrap']} (data in {data}, pid {proxy.pid})"
        )
        # topics are made and deleted on the embedded broker itself, as the latency scenario does on 3.9
        admin = starts[-1]["broker_bootstrap"] or proxy.bootstrap
        done(_latency_run("kshare", proxy.bootstrap, admin, rate, total_s, size, warmup_s, window_s, linger_ms))
        if not proxy.running:
            raise RuntimeError("the embedded kshare proxy exited:\n" + "".join(proxy.output[-30:]))
    finally:
        if proxy is not None:
            proxy.stop()
            notes += proxy.notes()
    k4 = env.kafka4()
    done(_latency_run("native", k4, k4, rate, total_s, size, warmup_s, window_s, linger_ms))
    progress.end()
    rows = []
    for s in samples:
        measured = [w for w in s["windows"] if not w["warmup"]]
        rows.append(
            {
                "system": s["system"],
                **{k: s[k] for k in ("p50_ms", "p99_ms", "p999_ms", "max_ms", "sent", "received", "duplicates",
                                     "measured", "producer_lag_max_ms")},
                "window_p50_min_ms": min((w["p50_ms"] for w in measured), default=float("nan")),
                "window_p50_max_ms": max((w["p50_ms"] for w in measured), default=float("nan")),
                "window_p99_min_ms": min((w["p99_ms"] for w in measured), default=float("nan")),
                "window_p99_max_ms": max((w["p99_ms"] for w in measured), default=float("nan")),
                "windows": s["windows"],
            }
        )
    later = [st["ready_s"] for st in starts[1:]]
    kshare = rows[0]
    return {
        "config": {
            "rate": rate,
            "seconds": seconds,
            "warmup_s": warmup_s,
            "window_s": window_s,
            "value_size": size,
            "linger_ms": linger_ms,
            "restarts": restarts,
            "command": command,
        },
        "rows": rows,
        "starts": starts,
        "ready": {
            "first_s": starts[0]["ready_s"],
            "later_s": later,
            "later_median_s": median(later),
        },
        "samples": [{k: v for k, v in s.items() if k not in ("quantiles_ms", "tail_ms", "windows")} for s in samples],
        "proxy_log_notes": notes[-20:],
        "targets": [
            target(
                f"kshare on its embedded broker at {rate:,.0f} records/s: every {window_s:g} s window's "
                "median (the highest)",
                kshare["window_p50_max_ms"],
                EMBEDDED_WINDOW_P50_MS,
                "<=",
                "ms",
            ),
            target(
                f"kshare on its embedded broker at {rate:,.0f} records/s: p99 over {seconds:g} s",
                kshare["p99_ms"],
                EMBEDDED_P99_MS,
                "<=",
                "ms",
            ),
        ],
    }


# --------------------------------------------------------------------------------------------
# 5a. ShareAcknowledge round trip with concurrent members


async def _ack_run(
    bootstrap: str,
    topic: str,
    members: int,
    acks_per_member: int,
    batch: int,
    rate: float = 0.0,
    seconds: list[float] | None = None,
) -> list[float]:
    """``members`` members of a fresh group fetch ``batch`` records and acknowledge them in one
    ShareAcknowledge, until the run has ``acks_per_member * members`` round trips. ``rate`` 0: each
    member as fast as it can (a closed loop: the machine's slowest part sets the pace). ``rate`` > 0:
    the members together start about ``rate`` cycles a second, at random phases (the same load
    however many members carry it). The run's wall-clock seconds are appended to ``seconds``."""
    seconds = seconds if seconds is not None else []
    group = f"bench-ack-{uuid.uuid4().hex[:8]}"
    await asyncio.to_thread(
        clients.set_group_configs, bootstrap, group, {"share.auto.offset.reset": "earliest"}
    )
    await clients.find_coordinator(bootstrap, group)
    conn = await clients.connect(bootstrap, "bench-ack")
    try:
        tid = await clients.topic_id(conn, topic)
    finally:
        await conn.close()
    ms = list(
        await asyncio.gather(*(clients.Member.join(bootstrap, group, topic, tid=tid) for _ in range(members)))
    )
    try:
        # each member works on one partition, a partition of its own where the assignment allows
        deadline = time.monotonic() + 60
        while len({p for m in ms for p in m.assigned}) < members and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            await asyncio.gather(*(m.heartbeat(None) for m in ms))
        taken: set[int] = set()
        parts: list[int] = []
        for i, m in enumerate(ms):
            free = [p for p in m.assigned if p not in taken]
            parts.append(free[0] if free else m.assigned[i % len(m.assigned)])
            taken.add(parts[-1])
        out: list[float] = []

        # Until the run has its samples, not per member: members that had to share a partition
        # (the assignor may give every member every partition) may find theirs drained early.
        wanted = acks_per_member * members
        cycle = members / rate if rate > 0 else 0.0

        async def run(i: int, m: clients.Member) -> None:
            part = parts[i]
            next_at = time.monotonic() + random.random() * cycle
            while len(out) < wanted:
                if cycle:
                    await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                    next_at += cycle * (0.5 + random.random())
                got = await m.fetch([part], max_records=batch)
                acks: dict[int, list] = {}
                for p, ranges in got.items():
                    for a, z, _ in ranges:
                        acks.setdefault(p, []).append((a, z, [clients.ACCEPT]))
                if not acks:
                    continue
                out.append(await m.acknowledge(acks))

        async with clients.keepalive(ms):
            started = time.monotonic()
            await asyncio.wait_for(asyncio.gather(*(run(i, m) for i, m in enumerate(ms))), 300)
            seconds.append(time.monotonic() - started)
        return out
    finally:
        await asyncio.gather(*(m.close() for m in ms), return_exceptions=True)


def ack(
    env: Env,
    progress: Progress,
    *,
    member_counts: list[int],
    samples_per_run: int,
    repeats: int,
    batch: int = 50,
    paced_rate: float = 400.0,
    paced_samples: int = 2000,
    systems: tuple[str, ...] = ("kshare", "native"),
) -> dict[str, Any]:
    """ShareAcknowledge round trips of 1..N concurrent members, kshare (on 3.9) and native Kafka
    4.4, in two loads: a closed loop (every member as fast as it can) and ``paced_rate`` cycles a
    second shared by the members (0: none)."""
    boot = {"kshare": (env.proxy().bootstrap, env.upstream())} if "kshare" in systems else {}
    if "native" in systems:
        k4 = env.kafka4()
        boot["native"] = (k4, k4)
    loads = [0.0] + ([paced_rate] if paced_rate > 0 else [])
    progress.begin("ack", len(boot) * (len(member_counts) * (1 + repeats * len(loads)) + 1))
    topics: dict[tuple[str, int], str] = {}
    samples = []
    try:
        for name, (_, admin) in boot.items():
            for n in member_counts:
                per_member = math.ceil(max(samples_per_run, paced_samples) / n)
                topic = clients.create_topic(admin, f"bench-ack-{n}-{uuid.uuid4().hex[:8]}", n)
                # every run has a fresh group starting at the earliest offset: enough for the longest
                clients.produce_batches(admin, topic, n * (per_member + 5) * batch, n, batch)
                topics[name, n] = topic
                progress.step(f"{name}: {n} partition(s) produced")
        for name, (bootstrap, _) in boot.items():
            warm = member_counts[min(1, len(member_counts) - 1)]
            asyncio.run(_ack_run(bootstrap, topics[name, warm], warm, 5, batch))
            progress.step(f"{name}: warm-up with {warm} members")
        for rate in loads:
            wanted = samples_per_run if rate == 0 else paced_samples
            for r in range(repeats):
                for n in alternate(member_counts, r):
                    for name in alternate(list(boot), r + n):
                        took: list[float] = []
                        lat = sorted(
                            asyncio.run(
                                _ack_run(
                                    boot[name][0], topics[name, n], n, math.ceil(wanted / n), batch, rate, took
                                )
                            )
                        )
                        smp = {
                            "system": name,
                            "rate": rate,
                            "members": n,
                            "acks": len(lat),
                            "acks_per_s": len(lat) / took[0] if took and took[0] > 0 else float("nan"),
                            "p50_ms": pct(lat, 0.5) * 1000,
                            "p99_ms": pct(lat, 0.99) * 1000,
                            "mean_ms": statistics.fmean(lat) * 1000,
                        }
                        samples.append(smp)
                        load_text = "closed loop" if rate == 0 else f"{rate:.0f} cycles/s"
                        progress.step(
                            f"{name}, {load_text}, {n} member(s): p50 {smp['p50_ms']:.2f} ms, "
                            f"p99 {smp['p99_ms']:.2f} ms ({len(lat)} acks)"
                        )
    finally:
        for (name, _), topic in topics.items():
            clients.delete_topic(boot[name][1], topic)
    rows = []
    for rate in loads:
        for name in boot:
            for n in member_counts:
                ss = [x for x in samples if x["members"] == n and x["system"] == name and x["rate"] == rate]
                if ss:
                    rows.append(
                        {
                            "system": name,
                            "rate": rate,
                            "members": n,
                            "acks": sum(x["acks"] for x in ss),
                            "acks_per_s": median([x["acks_per_s"] for x in ss]),
                            "p50_ms": median([x["p50_ms"] for x in ss]),
                            "p99_ms": median([x["p99_ms"] for x in ss]),
                            "mean_ms": median([x["mean_ms"] for x in ss]),
                        }
                    )
    by = {(r["system"], r["rate"], r["members"]): r for r in rows}
    for r in rows:
        one = by.get((r["system"], r["rate"], 1))
        r["vs_one"] = r["p50_ms"] / one["p50_ms"] if one else float("nan")
    # The target compares 16 concurrent members with one at the same load, the paced one: what
    # concurrency itself costs (sessions, connections, state writes of many share-partitions at
    # once). In the closed loop 16 members ask for 16 times one member's load, and on the project's
    # 2 cores the proxy (a core), the broker and the bench's own members all run out of CPU, so the
    # p50 there grows with the members by Little's law whatever the system (native Kafka 4.4:
    # 4-6x); it is reported beside it with the throughput each system reached.
    targets = []
    load = paced_rate if paced_rate > 0 else 0.0
    if ("kshare", load, 16) in by:
        load_text = f"at {load:,.0f} cycles/s" if load else "closed loop"
        targets.append(
            target(
                f"ack p50 with 16 concurrent members / p50 with one ({load_text})",
                by["kshare", load, 16]["vs_one"],
                ACK_TARGET,
                "<=",
            )
        )
    progress.end()
    return {
        "config": {
            "members": member_counts,
            "samples_per_run": samples_per_run,
            "paced_rate": paced_rate,
            "paced_samples": paced_samples,
            "repeats": repeats,
            "records_per_ack": batch,
            "systems": list(boot),
        },
        "rows": rows,
        "samples": samples,
        "targets": targets,
    }


# --------------------------------------------------------------------------------------------
# 5b. proxy CPU per MB/s delivered


def cpu(
    env: Env, progress: Progress, *, earlier: dict[str, Any], records: dict[int, int], repeats: int
) -> dict[str, Any]:
    """Millicores of the proxy process per MB/s of record values it delivered (= CPU ms per MB), from
    the pass-through and share scenarios of this run, or measured here (kshare only) if they did not run."""
    rows = []
    pt = earlier.get("passthrough")
    if pt is None:
        pt = passthrough(env, progress, records=records, repeats=repeats, configs=["kshare"], warmup=False)
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
        sh = share(
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
            f"proxy CPU, {r['workload']} {_size(r['value_size'])} (millicores per MB/s)",
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


# --------------------------------------------------------------------------------------------
# 5c. proxy memory with many share-partitions and connections


def _cache_budget_mb(proxy_args: list[str], default: int) -> int:
    for i, a in enumerate(proxy_args):
        if a == "--record-cache-mb" and i + 1 < len(proxy_args):
            return int(proxy_args[i + 1])
        if a.startswith("--record-cache-mb="):
            return int(a.split("=", 1)[1])
    return default


async def _memory_load(
    bootstrap: str, topic: str, groups: int, members: int, partitions: int, records: int, progress: Progress
) -> dict[str, Any]:
    conn = await clients.connect(bootstrap, "bench-memory")
    try:
        tid = await clients.topic_id(conn, topic)
    finally:
        await conn.close()
    names = [f"bench-memory-{g}-{uuid.uuid4().hex[:6]}" for g in range(groups)]
    for group in names:
        await asyncio.to_thread(
            clients.set_group_configs, bootstrap, group, {"share.auto.offset.reset": "earliest"}
        )
    sem = asyncio.Semaphore(64)

    async def join(group: str) -> clients.Member:
        async with sem:
            return await clients.Member.join(bootstrap, group, topic, tid=tid)

    all_members: list[clients.Member] = []
    touched: set[tuple[str, int]] = set()
    acquired = 0
    async with clients.keepalive(all_members, interval=5.0):
        for group in names:
            ms = list(await asyncio.gather(*(join(group) for _ in range(members))))
            all_members.extend(ms)
            deadline = time.monotonic() + 120  # until the assignment covers the topic
            while time.monotonic() < deadline:
                if len({p for m in ms for p in m.assigned}) == partitions:
                    break
                await asyncio.sleep(0.5)
                await asyncio.gather(*(m.heartbeat(None) for m in ms))
            progress.step(f"group {group}: {members} members joined; proxy connections up")

        async def read(m: clients.Member, mine: set[int]) -> int:
            n = 0
            pending = set(mine)
            for _ in range(10):
                if not pending:
                    break
                got = await m.fetch(sorted(pending), max_records=records * len(pending), max_wait_ms=500)
                acks: dict[int, list] = {}
                for p, ranges in got.items():
                    if ranges:
                        pending.discard(p)
                        touched.add((m.group, p))
                    for a, z, _ in ranges:
                        n += z - a + 1
                        acks.setdefault(p, []).append((a, z, [clients.ACCEPT]))
                if acks:
                    await m.acknowledge(acks)
            return n

        for group in names:
            ms = [m for m in all_members if m.group == group]
            # each partition is read by one of the members assigned it (the assignor may give every
            # member every partition)
            holders: dict[int, list[int]] = {}
            for j, m in enumerate(ms):
                for p in m.assigned:
                    holders.setdefault(p, []).append(j)
            mine: list[set[int]] = [set() for _ in ms]
            for p, js in holders.items():
                mine[js[p % len(js)]].add(p)
            acquired += sum(await asyncio.gather(*(read(m, mine[j]) for j, m in enumerate(ms))))
            progress.step(
                f"group {group}: {len({p for g, p in touched if g == group})} share-partitions read"
            )
        return {"members": all_members, "touched": len(touched), "acquired": acquired}


def memory(
    env: Env,
    progress: Progress,
    *,
    groups: int,
    members: int,
    partitions: int,
    records: int,
    value_size: int = 1024,
    cache_mb: int = 64,
) -> dict[str, Any]:
    budget_mb = _cache_budget_mb(env.proxy_args, cache_mb)
    extra = list(env.proxy_args)
    if "--record-cache-mb" not in " ".join(extra):
        extra += ["--record-cache-mb", str(budget_mb)]
    progress.begin("memory", 3 + 2 * groups)
    topic = clients.create_topic(env.upstream(), f"bench-memory-{uuid.uuid4().hex[:8]}", partitions)
    proxy = None
    try:
        clients.produce(env.upstream(), topic, records * partitions, value_size, partitions)
        progress.step(f"{records * partitions:,} x {value_size} B on {partitions} partitions produced")
        proxy = ProxyProcess(
            env.upstream(), extra, name="kshare (memory)", log_path=env.options.out / "kshare-memory.log"
        )
        proxy.start(180)
        time.sleep(2.0)
        rss_idle = rss_bytes(proxy.pid)
        progress.step(f"fresh proxy, --record-cache-mb {budget_mb}: RSS {rss_idle / 2**20:.0f} MB")
        peak = [rss_idle]
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.wait(0.25):
                with contextlib.suppress(OSError):
                    peak[0] = max(peak[0], rss_bytes(proxy.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()

        async def go() -> dict[str, Any]:
            got = await _memory_load(proxy.bootstrap, topic, groups, members, partitions, records, progress)
            await asyncio.sleep(2.0)
            got["metrics"] = await asyncio.to_thread(proxy.metrics)
            got["rss_loaded"] = rss_bytes(proxy.pid)
            await asyncio.gather(*(m.close() for m in got.pop("members")), return_exceptions=True)
            return got

        c0 = cpu_seconds(proxy.pid)
        got = asyncio.run(go())
        cpu_s = cpu_seconds(proxy.pid) - c0
        time.sleep(2.0)
        sampling.set()
        sampler.join(5)
        rss_after = rss_bytes(proxy.pid)
        metrics_after = proxy.metrics()
        progress.step(
            f"RSS idle {rss_idle / 2**20:.0f} MB, peak {peak[0] / 2**20:.0f} MB, "
            f"record cache {got['metrics'].get('kshare_record_cache_bytes', 0) / 2**20:.0f} MB"
        )
        notes = proxy.notes()
    finally:
        if proxy is not None:
            proxy.stop()
        clients.delete_topic(env.upstream(), topic)
    m = got["metrics"]
    row = {
        "groups": groups,
        "members_per_group": members,
        "connections": groups * members,
        "partitions": partitions,
        "share_partitions_touched": got["touched"],
        "records_acquired": got["acquired"],
        "data_mb": records * partitions * value_size / 1e6,
        "cache_budget_mb": budget_mb,
        "rss_idle_mb": rss_idle / 2**20,
        "rss_peak_mb": peak[0] / 2**20,
        "rss_loaded_mb": got["rss_loaded"] / 2**20,
        "rss_after_close_mb": rss_after / 2**20,
        "record_cache_mb": m.get("kshare_record_cache_bytes", float("nan")) / 2**20,
        "record_cache_budget_metric_mb": m.get("kshare_record_cache_budget_bytes", float("nan")) / 2**20,
        "record_cache_partitions": m.get("kshare_record_cache_partitions", float("nan")),
        "client_connections_metric": m.get("kshare_client_connections", float("nan")),
        "record_cache_mb_after_close": metrics_after.get("kshare_record_cache_bytes", float("nan")) / 2**20,
        "cpu_s": cpu_s,
    }
    limit = row["rss_idle_mb"] + budget_mb + MEMORY_OVERHEAD_MB
    row["rss_limit_mb"] = limit
    targets = [
        target(
            f"proxy peak RSS with {row['share_partitions_touched']:,} share-partitions and {row['connections']:,} "
            f"connections <= idle + {budget_mb} MB cache budget + {MEMORY_OVERHEAD_MB} MB",
            row["rss_peak_mb"],
            limit,
            "<=",
            "MB",
        ),
        target(
            "kshare_record_cache_bytes within --record-cache-mb",
            row["record_cache_mb"],
            budget_mb,
            "<=",
            "MB",
        ),
    ]
    return {
        "config": {
            "groups": groups,
            "members_per_group": members,
            "partitions": partitions,
            "records_per_partition": records,
            "value_size": value_size,
            "record_cache_mb": budget_mb,
            "fixed_overhead_mb": MEMORY_OVERHEAD_MB,
        },
        "rows": [row],
        "samples": [],
        "targets": targets,
        "notes": notes,
    }


# --------------------------------------------------------------------------------------------
# 9. the kshare PySpark source vs Spark's own Kafka source


def _produce_records(bootstrap: str, topic: str, records: int, size: int, partitions: int) -> None:
    """``records`` values of ``size`` bytes, round robin over the partitions, in producer batches of
    16 KB (the Java producer's default ``batch.size``; about 150 records of 100 B), as an application
    writes them: the topic both Spark sources read."""
    from confluent_kafka import KafkaException, Producer

    errors: list[object] = []
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 5,
            "batch.size": 16384,
            "compression.type": "none",
            "acks": "all",
            "delivery.report.only.error": True,
            "on_delivery": lambda err, msg: errors.append(err),
        }
    )
    value = bytes(size)
    for i in range(records):
        try:
            producer.produce(topic, value, partition=i % partitions)
        except BufferError:
            producer.poll(0.05)
            producer.produce(topic, value, partition=i % partitions)
    left = producer.flush(120)
    if left or errors:
        raise KafkaException(f"produce to {topic}: {left} undelivered, errors {errors[:3]}")


def _spark_locks(tasks: int, partitions: int, per_task: int, cap: int = 4000) -> int:
    """``share.partition.max.record.locks`` as docs/spark.md advises: twice what one micro-batch's
    tasks hold of a partition (so micro-batch N+1 acquires while N waits for its commit), at least
    the default 2000 and at most kshare's default cap."""
    return max(2000, min(cap, 2 * math.ceil(tasks / partitions) * per_task))


def _spark_child(env: Env, progress: Progress, plan: dict[str, Any], label: dict[str, str],
                 timeout: float) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run ``plan`` in ``python -m kshare.bench.sparkrun`` (output to spark.log); one progress step
    per query. Returns the session's line and the queries' results."""
    import json
    import os
    import signal
    import subprocess
    import sys

    from .brokers import _die_with_parent
    from .procs import kshare_env

    out = env.options.out / "spark"
    out.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:6]
    plan_path, results_path = out / f"plan-{tag}.json", out / f"results-{tag}.jsonl"
    plan = {**plan, "results": str(results_path.resolve())}
    plan_path.write_text(json.dumps(plan, indent=1))
    results_path.write_text("")
    log = open(env.options.out / "spark.log", "a")  # noqa: SIM115
    child_env = {**os.environ, **kshare_env(), "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.Popen(
        _die_with_parent([sys.executable, "-m", "kshare.bench.sparkrun", str(plan_path.resolve())]),
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=child_env, start_new_session=True,
    )
    session: dict[str, Any] = {}
    runs: list[dict[str, Any]] = []
    seen = 0
    deadline = time.monotonic() + timeout
    try:
        while True:
            lines = results_path.read_text().splitlines()
            for line in lines[seen:]:
                d = json.loads(line)
                if d.get("event") == "session":
                    session = d
                    if "error" in d:
                        raise RuntimeError(f"Spark did not start: {d['error']} (see spark.log)")
                    progress.note(f"Spark {d['spark']} ({d['master']}, {d['packages'] or 'no packages'}) "
                                  f"ready in {d['session_s']:.0f} s")
                    continue
                runs.append(d)
                what = label.get(d.get("config", ""), d.get("config", ""))
                progress.step(
                    f"{what}: " + (f"failed: {d['error']}" if "error" in d else
                                   f"{d['records_per_s']:,.0f} rec/s ({d['of_ideal']:.0%} of ideal), overhead "
                                   f"{d['overhead_ms']:,.0f} ms per micro-batch")
                )
            seen = len(lines)
            if proc.poll() is not None:
                if len(runs) < len(plan["runs"]) and not session.get("error"):
                    raise RuntimeError(f"the Spark process exited ({proc.returncode}) after {len(runs)} of "
                                       f"{len(plan['runs'])} queries (see spark.log)")
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"the Spark queries did not finish within {timeout:.0f} s (see spark.log)")
            time.sleep(0.5)
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()
    return session, runs


def spark(
    env: Env,
    progress: Progress,
    *,
    seconds: float,
    repeats: int,
    pairs: list[tuple[int, int]] | None = None,
    alone: list[int] | None = None,
    per_task: int = 500,
    value_size: int = 100,
    watch_ms: list[float] | None = None,
    warmup: bool = True,
) -> dict[str, Any]:
    """The kshare source (``format("kshare")``, through the kshare proxy) against Spark's own Kafka
    source (``format("kafka")``, directly on the fronted Kafka 3.9) in one Spark session, local mode:
    the same topic, a Python UDF of 5 ms per record, a ``foreachBatch`` sink counting rows, the default
    trigger. ``pairs`` (partitions, tasks): both sources side by side (kshare ``parallelism`` = tasks,
    the Kafka source's ``minPartitions`` = tasks and ``maxOffsetsPerTrigger`` = tasks x ``per_task``,
    kshare's ``maxRecordsPerTask``); ``alone``: the kshare source alone at these parallelisms on one
    partition (a pair's figure is reused for its parallelism). Each query reads ``tasks x 200 x
    seconds`` records (its ideal run time is ``seconds``). ``watch_ms``: more kshare configurations in
    the pairs, with the workers' commit watch at these intervals instead of the code's."""
    from . import sparkrun

    problem = sparkrun.pyspark_problem()
    if problem:
        raise RuntimeError(problem)
    import pyspark

    pairs = [tuple(p) for p in (pairs or [(1, 4), (2, 8)])]  # type: ignore[misc]
    alone = [p for p in (alone or [1, 2, 4, 8]) if (1, p) not in pairs]
    watch_ms = list(watch_ms or [])
    upstream = env.upstream()
    proxy = env.proxy()
    cores = max([t for _, t in pairs] + alone)
    rate = 1.0 / sparkrun.WORK_S  # per task
    kinds = ["kafka", "kshare", *(f"kshare-watch{w:g}" for w in watch_ms)]
    label = {}

    def records_for(tasks: int) -> int:
        # whole micro-batches: every one full, for both sources
        batch = tasks * per_task
        return max(3, round(tasks * rate * seconds / batch)) * batch

    topics: dict[tuple[int, int], str] = {}

    def topic_for(partitions: int, records: int) -> str:
        if (partitions, records) not in topics:
            name = clients.create_topic(upstream, f"bench-spark-{partitions}p-{uuid.uuid4().hex[:8]}", partitions)
            topics[(partitions, records)] = name
            _produce_records(upstream, name, records, value_size, partitions)
        return topics[(partitions, records)]

    def query(kind: str, partitions: int, tasks: int, records: int) -> dict[str, Any]:
        config = f"{kind} {partitions}p {tasks}t"
        topic = topic_for(partitions, records)
        q: dict[str, Any] = {"config": config, "kind": kind, "source": "kafka" if kind == "kafka" else "kshare",
                             "partitions": partitions, "tasks": tasks, "per_task": per_task, "records": records,
                             "topic": topic, "timeout_s": 10 * seconds + 300}
        if kind == "kafka":
            q["bootstrap"] = upstream
            label[config] = f"Kafka source, {partitions} partition(s), {tasks} tasks"
        else:
            group = f"bench-spark-{uuid.uuid4().hex[:8]}"
            locks = _spark_locks(tasks, partitions, per_task)
            clients.set_group_configs(proxy.bootstrap, group, {"share.auto.offset.reset": "earliest",
                                                               "share.partition.max.record.locks": locks})
            q.update(bootstrap=proxy.bootstrap, group=group, record_locks=locks)
            if kind != "kshare":
                q["watch_ms"] = float(kind.removeprefix("kshare-watch"))
            label[config] = f"{kind}, {partitions} partition(s), {tasks} tasks"
        return q

    runs: list[dict[str, Any]] = []
    if warmup:  # the JVM, the Python workers, the first connections: not measured
        wp, wt = pairs[0]
        for kind in kinds[:2]:
            runs.append({**query(kind, wp, wt, 3 * wt * per_task), "warmup": True})
    for r in range(repeats):
        for partitions, tasks in pairs:
            for kind in alternate(kinds, r):
                runs.append({**query(kind, partitions, tasks, records_for(tasks)), "repeat": r})
        for tasks in alternate(alone, r):
            runs.append({**query("kshare", 1, tasks, records_for(tasks)), "repeat": r})
    progress.begin("spark", len(runs))
    packages = sparkrun.kafka_package(pyspark.__version__, sparkrun.published_versions())
    plan = {"cores": cores, "packages": packages, "runs": runs}
    expected_s = sum(q["records"] / (q["tasks"] * rate) * 1.4 + 10 for q in runs)
    try:
        session, results = _spark_child(env, progress, plan, label, timeout=expected_s + 900)
    finally:
        for name in topics.values():
            clients.delete_topic(upstream, name)
    progress.end()
    samples = [s for s in results if not s.get("warmup")]

    def med(config: str, key: str) -> float:
        return median([s.get(key) for s in samples if s.get("config") == config and "error" not in s])

    rows: list[dict[str, Any]] = []
    configs = list(dict.fromkeys(s["config"] for s in runs if not s.get("warmup")))
    for config in configs:
        first = next(s for s in runs if s["config"] == config)
        done = [s for s in samples if s.get("config") == config and "error" not in s]
        row: dict[str, Any] = {
            "config": config,
            "label": label.get(config, config),
            "kind": first["kind"],
            "source": first["source"],
            "partitions": first["partitions"],
            "tasks": first["tasks"],
            "records": first["records"],
            "record_locks": first.get("record_locks"),
            "runs": len(done),
            "failed": len([s for s in samples if s.get("config") == config and "error" in s]),
            "records_per_s": med(config, "records_per_s"),
            "ideal_rps": first["tasks"] * rate,
            "overhead_ms": med(config, "overhead_ms"),
            "overhead_median_ms": med(config, "overhead_median_ms"),
            "overhead_busiest_ms": med(config, "overhead_busiest_ms"),
            "second_batch_overhead_ms": med(config, "second_batch_overhead_ms"),
            "first_batch_ms": med(config, "first_batch_ms"),
            "rows_per_batch": med(config, "rows_per_batch"),
            "batches": med(config, "batches"),
            "gaps_ms": med(config, "gaps_ms"),
            "rows_delivered": [s.get("rows") for s in done],
            "phases_ms": {k: median([s["phases_ms"].get(k) for s in done if s.get("phases_ms")])
                          for k in sparkrun.PHASES},
        }
        row["of_ideal"] = row["records_per_s"] / row["ideal_rps"]
        rows.append(row)
    targets = []
    by = {r["config"]: r for r in rows}
    for partitions, tasks in pairs:
        kafka, kshare = by.get(f"kafka {partitions}p {tasks}t"), by.get(f"kshare {partitions}p {tasks}t")
        if not kafka or not kshare:
            continue
        kshare["vs_kafka_rps"] = kshare["records_per_s"] / kafka["records_per_s"]
        kshare["vs_kafka_per_round"] = median([
            a["records_per_s"] / b["records_per_s"]
            for a, b in zip(
                [s for s in samples if s["config"] == kshare["config"] and "error" not in s],
                [s for s in samples if s["config"] == kafka["config"] and "error" not in s],
                strict=False,
            )
        ])
        kshare["overhead_over_kafka_ms"] = kshare["overhead_ms"] - kafka["overhead_ms"]
        for w in watch_ms:
            other = by.get(f"kshare-watch{w:g} {partitions}p {tasks}t")
            if other:
                other["vs_kafka_rps"] = other["records_per_s"] / kafka["records_per_s"]
                other["overhead_over_kafka_ms"] = other["overhead_ms"] - kafka["overhead_ms"]
        what = f"{partitions} partition{'s' if partitions > 1 else ''}, {tasks} tasks"
        targets += [
            target(f"Spark, {what}: kshare source / Kafka source, records/s", kshare["vs_kafka_rps"],
                   SPARK_RATE_TARGET, ">="),
            target(f"Spark, {what}: kshare's overhead per micro-batch - the Kafka source's",
                   kshare["overhead_over_kafka_ms"], SPARK_OVERHEAD_TARGET_MS, "<=", "ms"),
        ]
    return {
        "config": {
            "seconds": seconds,
            "per_task": per_task,
            "value_size": value_size,
            "work_ms": sparkrun.WORK_S * 1000,
            "pairs": pairs,
            "alone": alone,
            "watch_ms": watch_ms,
            "repeats": repeats,
            "cores": cores,
            "packages": packages,
            "spark": session.get("spark"),
            "session_s": session.get("session_s"),
            "kafka_bootstrap": "the Kafka 3.9 broker directly" if not env.options.upstream else "--upstream directly",
            "kshare_bootstrap": "kshare proxy",
        },
        "rows": rows,
        "samples": samples,
        "targets": targets,
    }


# --------------------------------------------------------------------------------------------
# 10. failover: a three-node cluster's brokers restarted one by one, then one killed, under share
# consumers and a producer; kshare on Kafka 3.9 beside native Kafka 4.4 share groups

FAILOVER_REDELIVERY_TARGET_PCT = 10.0  # redeliveries over the roll + kill, % of the records
FAILOVER_STALL_TARGET_S = 10.0  # the longest time records were available and none was delivered
FAILOVER_FAULTS = (("SIGTERM", 1), ("SIGTERM", 2), ("SIGTERM", 3), ("SIGKILL", 2))
_ID = struct.Struct(">q")  # a record's value starts with its id


def _failover_consumer(name: str, bootstrap: str, group: str, topic: str, work_s: float, max_poll: int,
                       seen, counts, slot: int, ready, stop, out) -> None:
    """A ShareConsumer (implicit acknowledgement) until ``stop``: the id, partition and time of every
    delivery (the time ``poll()`` returned it), ``work_s`` of work a record; marks ``seen[id]`` and
    counts its deliveries in ``counts[slot]`` for the parent to watch. Sends what it got to ``out``."""
    from confluent_kafka import ShareConsumer

    ids, parts, times = array("q"), array("b"), array("d")
    errors: dict[str, int] = {}
    ack_failed: dict[str, int] = {}
    acked = [0]

    def on_error(err: Any) -> None:
        key = f"client: {err.name()}"
        errors[key] = errors.get(key, 0) + 1

    def on_commit(offsets: Any, exc: Any) -> None:
        n = sum(len(v) for v in offsets.values()) if offsets else 0
        if exc is None:
            acked[0] += n
        else:
            err = exc.args[0] if exc.args else exc
            key = err.name() if hasattr(err, "name") else str(err)
            ack_failed[key] = ack_failed.get(key, 0) + n

    c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, "max.poll.records": max_poll,
                       "error_cb": on_error, "log_level": 0})  # errors counted, not printed
    c.set_acknowledgement_commit_callback(on_commit)
    c.subscribe([topic])
    ready.set()
    unpack = _ID.unpack_from
    try:
        while not stop.is_set():
            try:
                msgs = c.poll(0.1)
            except Exception as exc:  # noqa: BLE001 - counted; the consumer goes on, as an application would
                key = f"poll: {exc}"[:120]
                errors[key] = errors.get(key, 0) + 1
                time.sleep(0.1)
                continue
            now = time.monotonic()
            for m in msgs:
                if m.error() is not None:
                    key = f"record: {m.error().name()}"
                    errors[key] = errors.get(key, 0) + 1
                    continue
                (rid,) = unpack(m.value())
                ids.append(rid)
                parts.append(m.partition())
                times.append(now)
                seen[rid] = 1
                counts[slot] += 1
            for m in msgs:  # the work, after every delivery of the batch is noted
                if m.error() is None:
                    time.sleep(work_s)
    finally:
        with contextlib.suppress(Exception):
            c.close()
        out.put(("consumed", name, ids.tobytes(), parts.tobytes(), times.tobytes(), errors, ack_failed, acked[0]))


def _failover_producer(bootstrap: str, topic: str, first_id: int, n: int, rate: float, partitions: int,
                       size: int, go, out) -> None:
    """Idempotent, acks=all: ``n`` records (ids ``first_id``...) at ``rate`` a second from ``go``, round
    robin over the partitions; sends the time each was handed to ``produce()`` and the time its delivery
    report said it was written (NaN: failed), and the errors."""
    from confluent_kafka import Producer

    sent = array("d", [math.nan]) * n
    acked = array("d", [math.nan]) * n
    errors: dict[str, int] = {}

    def report(err: Any, msg: Any) -> None:
        i = _ID.unpack_from(msg.value())[0] - first_id
        if err is None:
            acked[i] = time.monotonic()
        else:
            errors[err.name()] = errors.get(err.name(), 0) + 1

    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5,
                  "message.timeout.ms": 300_000, "error_cb": clients._quiet, "log_level": 0})
    pad = b"." * max(0, size - _ID.size)
    go.wait()
    t0 = time.monotonic()
    lag_max = 0.0
    for i in range(n):
        due = t0 + i / rate
        while (wait := due - time.monotonic()) > 0:
            p.poll(wait)  # delivery reports are served (and timed) while waiting
        lag_max = max(lag_max, time.monotonic() - due)
        value = _ID.pack(first_id + i) + pad
        while True:
            try:
                p.produce(topic, value, partition=i % partitions, on_delivery=report)
                break
            except BufferError:
                p.poll(0.01)
        sent[i] = time.monotonic()
        p.poll(0)
    left = p.flush(600)
    out.put(("produced", sent.tobytes(), acked.tobytes(), errors, left, lag_max))


def _produce_ids(bootstrap: str, topic: str, n: int, partitions: int, size: int) -> None:
    """Records with ids 0..n-1, round robin over the partitions, idempotent and acks=all, as fast as
    the cluster takes them (producer batches of up to 16 KB, the Java client's default)."""
    from confluent_kafka import KafkaException, Producer

    failed: list[object] = []
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5,
                  "batch.size": 16384, "error_cb": clients._quiet, "log_level": 3,
                  "on_delivery": lambda err, _msg: failed.append(err) if err is not None else None})
    pad = b"." * max(0, size - _ID.size)
    for i in range(n):
        while True:
            try:
                p.produce(topic, _ID.pack(i) + pad, partition=i % partitions)
                break
            except BufferError:
                p.poll(0.05)
    left = p.flush(300)
    if left or failed:
        raise KafkaException(f"producing to {topic}: {left} undelivered, errors {failed[:3]}")


def _overlap_max(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    """The longest part of any interval inside [start, end)."""
    return max((min(b, end) - max(a, start) for a, b in intervals if b > start and a < end), default=0.0)


def failover_analysis(
    deliveries: list[tuple[float, int, int]],
    available: dict[int, float],
    windows: list[dict[str, Any]],
    acks: list[tuple[float, float]],
    t_end: float,
) -> dict[str, Any]:
    """What a failover run's timeline says.

    ``deliveries``: (time, record id, partition) of every delivery, any consumer; ``available``: record
    id -> the time it could first be delivered (the records produced before: when the consumers started;
    the others: when the producer's delivery report said the cluster had them), for every record the
    cluster acknowledged; ``windows``: dicts with ``name``, ``start``, ``end`` and, for a fault,
    ``signal`` (the time it was sent) and ``partitions`` (those its broker led); ``acks``: (sent,
    acknowledged) times of the producer's records that were written; ``t_end``: when the consumers
    stopped.

    A delivery of a record delivered before is a redelivery, counted in the window it happened in.
    A *stall* is a stretch without any delivery during which some record was available and not yet
    delivered (from the first delivery on: the group's first join is not a failover's doing); a record
    delivered before and given again counts as delivered, so it is left out of it. The producer's stall
    is the longest time between two successful delivery reports."""
    import heapq

    deliveries = sorted(deliveries)
    first: dict[int, float] = {}
    redelivered = []
    for t, rid, _p in deliveries:
        if rid in first:
            redelivered.append(t)
        else:
            first[rid] = t
    # stalls: gaps between deliveries in which a record was available and not yet delivered
    heap = [(a, rid) for rid, a in available.items()]
    heapq.heapify(heap)
    stalls: list[tuple[float, float]] = []
    times = [t for t, _, _ in deliveries]
    edges = list(zip(times, [*times[1:], t_end], strict=True)) if times else []
    for prev, nxt in edges:
        if nxt <= prev:
            continue
        while heap and first.get(heap[0][1], math.inf) <= prev:
            heapq.heappop(heap)
        if heap and heap[0][0] < nxt:
            stalls.append((max(heap[0][0], prev), nxt))
    lost = sorted(rid for rid in available if rid not in first)
    ack_times = sorted(b for _, b in acks)
    producer_gaps = list(zip(ack_times, ack_times[1:], strict=False))
    out_windows = []
    for w in windows:
        start, end = w["start"], w["end"]
        inside = [(t, rid, p) for t, rid, p in deliveries if start <= t < end]
        re_n = sum(1 for t in redelivered if start <= t < end)
        row: dict[str, Any] = {
            **{k: v for k, v in w.items() if k not in ("start", "end")},
            "start": start,
            "end": end,
            "deliveries": len(inside),
            "redeliveries": re_n,
            "longest_stall_s": _overlap_max(stalls, start, end),
            "producer_longest_gap_s": _overlap_max(producer_gaps, start, end),
            "producer_longest_wait_s": max((b - a for a, b in acks if start <= a < end), default=math.nan),
        }
        if "signal" in w:
            sig = w["signal"]
            after = [t for t, _, _ in deliveries if t >= sig]
            row["first_record_s"] = after[0] - sig if after else math.nan
            per_part = {}
            for p in w.get("partitions", []):
                ts = [t for t, _, q in deliveries if q == p and t >= sig]
                per_part[p] = ts[0] - sig if ts else math.nan
            row["first_record_of_its_partitions_s"] = max(per_part.values()) if per_part else math.nan
            row["first_record_per_partition_s"] = per_part
        out_windows.append(row)
    return {
        "records": len(available),
        "delivered": len([r for r in available if r in first]),
        "lost": len(lost),
        "lost_ids": lost[:20],
        "deliveries": len(deliveries),
        "redeliveries": len(redelivered),
        "stalls": stalls,
        "producer_longest_gap_s": max((b - a for a, b in producer_gaps), default=math.nan),
        "windows": out_windows,
    }


def _timeline(deliveries: list[tuple[float, int, int]], acks: list[tuple[float, float]], t0: float,
              t_end: float) -> dict[str, list[int]]:
    """Per second from ``t0``: deliveries, redeliveries and the producer's acknowledged records."""
    n = max(1, math.ceil(t_end - t0))
    dl, rd, pr = [0] * n, [0] * n, [0] * n
    seen: set[int] = set()
    for t, rid, _ in sorted(deliveries):
        i = min(n - 1, max(0, int(t - t0)))
        dl[i] += 1
        if rid in seen:
            rd[i] += 1
        seen.add(rid)
    for _, b in acks:
        pr[min(n - 1, max(0, int(b - t0)))] += 1
    return {"deliveries": dl, "redeliveries": rd, "produced": pr}


def _log_levels(path: Path) -> dict[str, Any]:
    """WARNING / ERROR / traceback lines of a kshare log: counts and the distinct messages (numbers
    and addresses masked), each with its count."""
    counts = {"WARNING": 0, "ERROR": 0, "CRITICAL": 0, "Traceback": 0}
    distinct: dict[str, int] = {}
    first: dict[str, str] = {}
    if path.exists():
        for line in path.read_text(errors="replace").splitlines():
            level = next((lv for lv in ("WARNING", "ERROR", "CRITICAL") if f" {lv} " in line), None)
            if "Traceback" in line:
                counts["Traceback"] += 1
            if level is None:
                continue
            counts[level] += 1
            msg = line.split(f" {level} ", 1)[1]
            key = f"{level} " + re.sub(r"\d+", "N", msg)[:160]
            distinct[key] = distinct.get(key, 0) + 1
            first.setdefault(key, line.rstrip()[:300])
    return {"counts": counts,
            "distinct": [{"count": n, "pattern": k, "first": first[k]}
                         for k, n in sorted(distinct.items(), key=lambda kv: -kv[1])][:40]}


def _failover_run(
    system: str,
    cluster: Any,
    bootstrap: str,
    progress: Progress,
    *,
    records_before: int,
    records_during: int,
    rate: float,
    partitions: int,
    consumers: int,
    work_ms: float,
    max_poll: int,
    lock_ms: int,
    baseline_s: float,
    settle_s: float,
    value_size: int,
    drain_timeout_s: float,
    check: Any = None,
) -> dict[str, Any]:
    """One system's run on its started three-node ``cluster``; clients connect to ``bootstrap`` (the
    proxy for kshare, the cluster for native). ``check()`` raises if the proxy is gone."""
    from confluent_kafka.admin import NewTopic

    ctx = mp.get_context("spawn")
    topic = f"bench-failover-{uuid.uuid4().hex[:8]}"
    group = f"bench-failover-{uuid.uuid4().hex[:8]}"
    admin = cluster.admin()
    admin.create_topics([NewTopic(topic, partitions, 3)], request_timeout=60)[topic].result(60)
    if not cluster.wait_preferred_leaders([topic], 60):
        raise RuntimeError(f"{system}: topic {topic} has no leaders after 60 s")
    # the records before: straight to the cluster for both systems (the same batches)
    t = time.monotonic()
    _produce_ids(cluster.bootstrap, topic, records_before, partitions, value_size)
    clients.set_group_configs(bootstrap, group, {"share.auto.offset.reset": "earliest",
                                                 "share.heartbeat.interval.ms": clients.HEARTBEAT_MS,
                                                 "share.record.lock.duration.ms": lock_ms})
    progress.step(f"{system}: {records_before:,} records produced in {time.monotonic() - t:.1f} s")
    total = records_before + records_during
    seen = ctx.RawArray("B", total)
    counts = ctx.RawArray("q", consumers + 1)
    stop, late_stop, go = ctx.Event(), ctx.Event(), ctx.Event()
    out = ctx.Queue()
    readies = [ctx.Event() for _ in range(consumers + 1)]
    procs = [
        ctx.Process(target=_failover_consumer, daemon=True,
                    args=(f"c{i}", bootstrap, group, topic, work_ms / 1000, max_poll, seen, counts, i,
                          readies[i], stop, out))
        for i in range(consumers)
    ]
    producer = ctx.Process(target=_failover_producer, daemon=True,
                           args=(bootstrap, topic, records_before, records_during, rate, partitions,
                                 value_size, go, out))
    late = ctx.Process(target=_failover_consumer, daemon=True,
                       args=("late", bootstrap, group, topic, 0.0, max_poll, ctx.RawArray("B", total), counts,
                             consumers, readies[consumers], late_stop, out))
    got: dict[str, tuple] = {}
    produced: tuple | None = None

    def collect(until: float, want: set[str]) -> None:
        """Results from the queue until those of ``want`` (consumer names, "producer") are in."""
        nonlocal produced
        names, producer_too = want - {"producer"}, "producer" in want
        while (names - set(got) or (producer_too and produced is None)) and time.monotonic() < until:
            try:
                msg = out.get(timeout=0.5)
            except queue.Empty:
                continue
            if msg[0] == "produced":
                produced = msg
            else:
                got[msg[1]] = msg

    faults: list[dict[str, Any]] = []
    try:
        producer.start()
        t0 = time.monotonic()  # the consumers start: the records produced before are available
        for pr in procs:
            pr.start()
        for r in readies[:consumers]:
            if not r.wait(120):
                raise TimeoutError(f"{system}: a consumer did not start in 120 s")
        go.set()
        time.sleep(baseline_s)
        for sig, node in FAILOVER_FAULTS:
            if check is not None:
                check()
            led = sorted(p for p, leader in cluster.leaders(topic).items() if leader == node)
            fault: dict[str, Any] = {"fault": sig, "node": node, "partitions": led}
            fault["signal"] = time.monotonic()
            cluster.stop_node(node, hard=sig == "SIGKILL")
            fault["exited"] = time.monotonic()
            cluster.start_node(node, timeout=120)
            fault["back"] = time.monotonic()
            fault["in_sync"] = cluster.wait_in_sync(120)
            fault["in_sync_at"] = time.monotonic()
            fault["leaders_back"] = cluster.wait_preferred_leaders(None, 60)
            fault["leaders_back_at"] = time.monotonic()
            faults.append(fault)
            progress.step(
                f"{system}: {sig} node {node} ({len(led)} of the topic's leaders): exited in "
                f"{fault['exited'] - fault['signal']:.1f} s, back {fault['back'] - fault['exited']:.1f} s later, "
                f"in sync after {fault['in_sync_at'] - fault['signal']:.0f} s, leaders back after "
                f"{fault['leaders_back_at'] - fault['signal']:.0f} s; {sum(counts[:consumers]):,} deliveries so far"
            )
            time.sleep(settle_s)
        if check is not None:
            check()
        t_faults_done = time.monotonic()
        collect(t_faults_done + drain_timeout_s, {"producer"})
        if produced is None:
            raise TimeoutError(f"{system}: the producer did not finish")
        acked_during = array("d")
        acked_during.frombytes(produced[2])
        expected = list(range(records_before)) + [
            records_before + i for i, a in enumerate(acked_during) if not math.isnan(a)
        ]
        deadline = time.monotonic() + drain_timeout_s
        while time.monotonic() < deadline:
            flags = bytes(seen)
            if all(flags[i] for i in expected):
                break
            time.sleep(0.5)
        # then until no delivery came for a lock's duration and a bit: a lock that runs out is counted
        quiet_s = lock_ms / 1000 + 5
        last, last_change = sum(counts[:consumers]), time.monotonic()
        while time.monotonic() - last_change < quiet_s and time.monotonic() < deadline + quiet_s:
            time.sleep(0.5)
            now_n = sum(counts[:consumers])
            if now_n != last:
                last, last_change = now_n, time.monotonic()
        t_end = time.monotonic()
        stop.set()
        collect(time.monotonic() + 120, {f"c{i}" for i in range(consumers)})
        for pr in procs:
            pr.join(30)
        # acknowledged stays acknowledged: a newcomer to the group gets nothing
        late.start()
        readies[consumers].wait(60)
        time.sleep(8)
        late_stop.set()
        collect(time.monotonic() + 60, {"late"})
        late.join(30)
        progress.step(
            f"{system}: {sum(counts[:consumers]):,} deliveries of {len(expected):,} records, drained "
            f"{t_end - t_faults_done:.0f} s after the last fault; a newcomer got {counts[consumers]}"
        )
    finally:
        stop.set()
        late_stop.set()
        go.set()
        for pr in [*procs, producer, late]:
            if pr.pid is None:
                continue
            pr.join(5)
            if pr.is_alive():
                pr.kill()
    missing = {f"c{i}" for i in range(consumers)} - set(got)
    if missing:
        raise RuntimeError(f"{system}: no results from consumer(s) {sorted(missing)}")
    deliveries: list[tuple[float, int, int]] = []
    client_errors: dict[str, int] = {}
    ack_failed: dict[str, int] = {}
    acked_total = 0
    for name in sorted(got):
        if name == "late":
            continue
        _, _, ids_b, parts_b, times_b, errors, failed, acked = got[name]
        ids, parts, times = array("q"), array("b"), array("d")
        ids.frombytes(ids_b)
        parts.frombytes(parts_b)
        times.frombytes(times_b)
        deliveries += list(zip(times, ids, parts, strict=True))
        for k, v in errors.items():
            client_errors[k] = client_errors.get(k, 0) + v
        for k, v in failed.items():
            ack_failed[k] = ack_failed.get(k, 0) + v
        acked_total += acked
    late_ids = array("q")
    if "late" in got:
        late_ids.frombytes(got["late"][2])
    sent, acked_at = array("d"), array("d")
    sent.frombytes(produced[1])
    acked_at.frombytes(produced[2])
    available = {i: t0 for i in range(records_before)}
    acks = []
    slow: dict[tuple[int, int], list[float]] = {}  # (fault, partition) -> waits over 2 s
    signals = [f["signal"] for f in faults]
    for i, (s, a) in enumerate(zip(sent, acked_at, strict=True)):
        if not math.isnan(a):
            available[records_before + i] = a
            acks.append((s, a))
            if a - s > 2.0:
                slow.setdefault((sum(1 for x in signals if x <= s), i % partitions), []).append(a - s)
    windows = [{"name": "before the faults", "start": t0, "end": faults[0]["signal"]}]
    for i, f in enumerate(faults):
        end = faults[i + 1]["signal"] if i + 1 < len(faults) else t_end
        windows.append({"name": f"{f['fault']} node {f['node']}", "start": f["signal"], "end": end,
                        "signal": f["signal"], "partitions": f["partitions"]})
    a = failover_analysis(deliveries, available, windows, acks, t_end)
    roll = [w for w in a["windows"] if "signal" in w]
    roll_re = sum(w["redeliveries"] for w in roll)
    for w, f in zip(roll, faults, strict=True):
        w.update({
            "exit_s": f["exited"] - f["signal"],
            "back_s": f["back"] - f["signal"],
            "in_sync_s": f["in_sync_at"] - f["signal"] if f["in_sync"] else math.nan,
            "leaders_back_s": f["leaders_back_at"] - f["signal"] if f["leaders_back"] else math.nan,
        })
    for w in a["windows"]:
        w["at_s"] = w["start"] - t0
        w["seconds"] = w["end"] - w["start"]
        w["redelivered_pct"] = 100 * w["redeliveries"] / max(1, a["records"])
        for k in ("start", "end", "signal"):
            w.pop(k, None)
    stalls_roll = [(x, y) for x, y in a["stalls"] if y > faults[0]["signal"]]
    return {
        "system": system,
        "topic": topic,
        "records": a["records"],
        "produce_failed": sum(produced[3].values()),
        "produce_errors": produced[3],
        "produce_left": produced[4],
        "producer_lag_max_s": produced[5],
        "delivered": a["delivered"],
        "lost": a["lost"],
        "lost_ids": a["lost_ids"],
        "deliveries": a["deliveries"],
        "redeliveries": a["redeliveries"],
        "redelivered_pct": 100 * a["redeliveries"] / max(1, a["records"]),
        "roll_redeliveries": roll_re,
        "roll_redelivered_pct": 100 * roll_re / max(1, a["records"]),
        "longest_stall_s": _overlap_max(stalls_roll, faults[0]["signal"], t_end),
        "baseline_longest_stall_s": a["windows"][0]["longest_stall_s"],
        "stalls_over_1s": [(round(x - t0, 2), round(y - x, 2)) for x, y in a["stalls"] if y - x > 1.0],
        "producer_longest_gap_s": a["producer_longest_gap_s"],
        "producer_longest_wait_s": max((b - s for s, b in acks), default=math.nan),
        # records that took over 2 s from produce() to their delivery report, per window and partition
        "slow_produce": [{"window": windows[w]["name"], "partition": p, "records": len(v), "max_wait_s": max(v)}
                         for (w, p), v in sorted(slow.items())],
        "late_deliveries": len(late_ids),
        "client_errors": client_errors,
        "ack_failed": ack_failed,
        "acked_by_clients": acked_total,
        "seconds": t_end - t0,
        "drain_s": t_end - t_faults_done,
        "windows": a["windows"],
        "timeline": _timeline(deliveries, acks, t0, t_end),
        "faults_at_s": [{"fault": f"{f['fault']} node {f['node']}", "signal_s": f["signal"] - t0,
                         "back_s": f["back"] - t0} for f in faults],
    }


def failover(
    env: Env,
    progress: Progress,
    *,
    records_before: int,
    records_during: int,
    rate: float,
    partitions: int = 6,
    consumers: int = 4,
    work_ms: float = 6.0,
    max_poll: int = 100,
    lock_ms: int = 15_000,
    baseline_s: float = 15.0,
    settle_s: float = 5.0,
    value_size: int = 100,
    drain_timeout_s: float = 600.0,
    systems: tuple[str, ...] = ("kshare", "native"),
) -> dict[str, Any]:
    """Three KRaft nodes (replication factor 3, ``min.insync.replicas`` 2) for each system, one after the
    other: Apache Kafka 3.9 with ``kshare proxy --upstream <the three>`` (its own process) and Apache
    Kafka 4.4 with share groups, used directly. A ``partitions``-partition topic with ``records_before``
    records; ``consumers`` ShareConsumers (each its own process; ``max.poll.records`` ``max_poll``,
    ``work_ms`` of work a record) drain it while an idempotent acks=all producer (its own process)
    writes ``records_during`` more at ``rate`` a second (through kshare for kshare); after
    ``baseline_s``, each broker in turn gets SIGTERM and is started again, then one is SIGKILLed and
    started again; before the next fault the bench waits (as a rolling restart does) until every
    replica is in sync and the preferred leaders are back, then ``settle_s``. The share groups'
    ``share.record.lock.duration.ms`` is ``lock_ms`` on both (native: also its broker default)."""
    from .brokers import KAFKA_3, KAFKA_4, ThreeNodeCluster
    from .procs import BENCH_BROKER_CONFIG, KAFKA4_CONFIG

    out_dir = env.options.out / "failover"
    out_dir.mkdir(parents=True, exist_ok=True)
    progress.begin("failover", len(systems) * (3 + len(FAILOVER_FAULTS)))
    rows: list[dict[str, Any]] = []
    log_summary: dict[str, Any] = {}
    metrics: dict[str, float] = {}
    command = ""
    sizes = dict(records_before=records_before, records_during=records_during, rate=rate, partitions=partitions,
                 consumers=consumers, work_ms=work_ms, max_poll=max_poll, lock_ms=lock_ms, baseline_s=baseline_s,
                 settle_s=settle_s, value_size=value_size, drain_timeout_s=drain_timeout_s)
    for system in systems:
        if system == "kshare":
            cluster = ThreeNodeCluster(KAFKA_3, config=BENCH_BROKER_CONFIG)
        else:
            cluster = ThreeNodeCluster(KAFKA_4, share_groups=True, config={
                **KAFKA4_CONFIG, "group.share.record.lock.duration.ms": lock_ms,
                "share.coordinator.state.topic.num.partitions": 3})
        proxy: ProxyProcess | None = None
        try:
            t = time.monotonic()
            cluster.start(180)
            what = "Apache Kafka 3.9" if system == "kshare" else "Apache Kafka 4.4 with share groups"
            env.started[f"failover-{system}"] = f"{what}, three nodes at {cluster.bootstrap}"
            if system == "kshare":
                log_path = env.options.out / "kshare-failover.log"
                proxy = ProxyProcess(cluster.bootstrap, ["--state-topic-partitions", "3",
                                                         "--state-topic-replication-factor", "3", *env.proxy_args],
                                     name="kshare-failover", log_path=log_path)
                proxy.start(180)
                command = shlex.join(["kshare", *proxy.cmd[3:]])
                env.started["kshare-failover"] = f"kshare proxy at {proxy.bootstrap} (pid {proxy.pid})"
                bootstrap = proxy.bootstrap

                def check(p: ProxyProcess = proxy) -> None:
                    if not p.running:
                        raise RuntimeError("the kshare proxy exited:\n" + "".join(p.output[-30:]))
            else:
                bootstrap, check = cluster.bootstrap, None
            progress.step(f"{system}: three nodes up in {time.monotonic() - t:.0f} s")
            row = _failover_run(system, cluster, bootstrap, progress, check=check, **sizes)
            if proxy is not None:
                row["proxy_running_at_end"] = proxy.running
                with contextlib.suppress(Exception):
                    metrics = {k: v for k, v in proxy.metrics().items()
                               if k.startswith(("kshare_state_", "kshare_share_lock", "kshare_share_deliveries",
                                                "kshare_share_archived", "kshare_upstream", "kshare_client_conn"))
                               and not k.endswith(("_bucket", "_created"))}
            rows.append(row)
        finally:
            if proxy is not None:
                proxy.stop()
                log_summary = _log_levels(proxy.log_path) if proxy.log_path else {}
                log_summary["notes"] = proxy.notes(30)
            for node_id, node in cluster.nodes.items():
                with contextlib.suppress(OSError):
                    shutil.copy(node.log_path, out_dir / f"{system}-node{node_id}.log")
            with contextlib.suppress(Exception):
                cluster.close()
    progress.end()
    by = {r["system"]: r for r in rows}
    targets = []
    k = by.get("kshare")
    if k is not None:
        n = by.get("native")
        targets = [
            target("failover, kshare: records lost", k["lost"], 0, "<="),
            target("failover, kshare: redeliveries over the roll + kill, % of the records",
                   k["roll_redelivered_pct"], FAILOVER_REDELIVERY_TARGET_PCT, "<=", "%"),
            target("failover, kshare: longest time records were available and none was delivered",
                   k["longest_stall_s"], FAILOVER_STALL_TARGET_S, "<=", "s"),
            target("failover, kshare: the producer's longest stall, no longer than on native 4.4",
                   k["producer_longest_gap_s"], n["producer_longest_gap_s"] if n else math.nan, "<=", "s"),
        ]
    return {
        "config": {**sizes, "faults": [f"{s} node {n}" for s, n in FAILOVER_FAULTS], "command": command,
                   "kshare_cluster": "Apache Kafka 3.9.2, three KRaft nodes",
                   "native_cluster": "Apache Kafka 4.4.0 with share groups, three KRaft nodes"},
        "rows": rows,
        "proxy_log": log_summary,
        "proxy_metrics": metrics,
        "targets": targets,
    }
