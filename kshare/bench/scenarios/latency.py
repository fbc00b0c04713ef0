"""The ``latency`` scenario of ``kshare bench``: End-to-end latency at a fixed rate: kshare, direct on Kafka 3.9, native Kafka 4.4."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import queue
import struct
import time
import uuid
from array import array
from typing import TYPE_CHECKING, Any

from .. import clients
from ..format import COLORS, fmt_num, line_axis, table
from .common import KAFKA4, UPSTREAM, alternate, median, pct, scenario, target

if TYPE_CHECKING:
    from ..runner import Env, Progress

LATENCY_TARGET_MS = 2.0  # kshare p99 - direct p99

SIZES = ({"rate": 5000.0, "seconds": 40.0, "warmup_s": 15.0}, {"rate": 5000.0, "seconds": 5.0, "warmup_s": 3.0})


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


def timed_run(system: str, bootstrap: str, admin_bootstrap: str, rate: float, seconds: float, size: int,
              skip_s: float, window_s: float = 0.0, linger_ms: int = 5) -> dict[str, Any]:
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
    windows = latency_windows(seqs, lat, rate, skip, window_s) if window_s else None
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


def latency_windows(seqs: array, lat: array, rate: float, skip: int, window_s: float) -> list[dict[str, Any]]:
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


def run(env: Env, progress: Progress, *, rate: float, seconds: float, repeats: int, size: int = 100,
        warmup_s: float = 5.0) -> dict[str, Any]:
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
            s = timed_run(name, bootstrap, admin_bootstrap, rate, warmup_s, size, 0.0)
            progress.step(f"warm-up {name}: p99 {s['p99_ms']:.2f} ms")
    for r in range(repeats):
        for name in alternate(list(systems), r):
            bootstrap, admin_bootstrap = systems[name]
            s = timed_run(name, bootstrap, admin_bootstrap, rate, seconds, size, min(1.0, seconds / 5))
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


# -- results.md and the plot ----------------------------------------------------------------------


def latency_cells(r: dict[str, Any], names: dict[str, str], *more: str) -> list[str]:
    """A row of a latency table (this scenario's, the embedded one's): the system, p50, p99, p99.9 and max ms,
    ``more`` cells, records received / sent and duplicates."""
    return [names.get(r["system"], r["system"]), fmt_num(r["p50_ms"], 2), fmt_num(r["p99_ms"], 2),
            fmt_num(r["p999_ms"], 2), fmt_num(r["max_ms"], 1), *more,
            f"{fmt_num(r['received'])} / {fmt_num(r['sent'])}", str(r.get("duplicates", 0))]


def section(res: dict[str, Any]) -> list[str]:
    cfg = res.get("config", {})
    names = {
        "direct": "classic consumer direct (3.9)",
        "kshare": "kshare share consumer (3.9)",
        "native": "native share consumer (4.4)",
    }
    rows = [latency_cells(r, names) for r in res.get("rows", [])]
    text = [
        f"One producer at {fmt_num(cfg.get('rate'))} records/s ({cfg.get('value_size', 100)} B, linger.ms 5, "
        f"acks=all) and one consumer, each its own process, {cfg.get('seconds', '?')} s per run; latency = "
        "time `poll()` returned the record - time it was handed to `produce()` (one clock). The producer and "
        "consumer of kshare bootstrap from kshare.",
        "",
    ]
    return (
        text
        + table(
            ["consumer", "p50 ms", "p99 ms", "p99.9 ms", "max ms", "received / sent", "duplicates"], rows
        )
        + [""]
    )


def plot(plt: Any, res: dict[str, Any]) -> Any:
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
    line_axis(ax1, "end-to-end latency (ms)", "fraction of records",
              f"CDF at {res['config'].get('rate', 0):,.0f} records/s")
    ax2.set_xscale("log")
    ax2.invert_xaxis()
    ax2.set_yscale("log")
    line_axis(ax2, "fraction of records slower (1 - quantile)", "latency (ms)", "tail: p99 (0.01) ... p99.99 (0.0001)")
    return fig


SCENARIO = scenario(
    __name__, 'End-to-end latency at a fixed rate',
    needs=frozenset({UPSTREAM, KAFKA4}),
)
