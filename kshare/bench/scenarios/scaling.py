"""The ``scaling`` scenario of ``kshare bench``: Scaling past partitions: N share consumers with 5 ms of work per record."""

from __future__ import annotations

import math
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

from .. import clients
from ..format import COLORS, bars, fmt_num, fmt_pct, line_axis, table
from .common import KAFKA4, UPSTREAM, alternate, median, produce_round_robin, scenario, work_member

if TYPE_CHECKING:
    from ..runner import Env, Progress


SIZES = (
    {
        "points": [(n, 1) for n in (1, 2, 4, 8, 16, 32)] + [(n, 4) for n in (1, 4, 8, 16, 32)] + [(3, 2), (6, 4)],
        "seconds": 10.0,
    },
    {"points": [(1, 1), (8, 1), (8, 4), (3, 2)], "seconds": 3.0},
)


def _scale_member(bootstrap: str, group: str, topic: str, work_s: float, max_poll: int,
                  ready: threading.Semaphore, start: threading.Event, stop: threading.Event,
                  times: list[float], errors: list[str]) -> None:
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
    work_member(c, start, stop, work_s, times)


def _scale_run(bootstrap: str, admin_bootstrap: str, consumers: int, partitions: int, seconds: float,
               work_ms: float, max_poll: int) -> dict[str, Any]:
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
        produce_round_robin(p, topic, total, partitions, b"." * 100)
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


def run(env: Env, progress: Progress, *, points: list[tuple[int, int]], seconds: float, repeats: int,
        work_ms: float = 5.0, max_poll: int = 25) -> dict[str, Any]:
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


# -- results.md and the plot ----------------------------------------------------------------------


def section(res: dict[str, Any]) -> list[str]:
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
            fmt_num(r["ideal_rps"]),
            fmt_num(r.get("kshare_rps")),
            fmt_pct(r.get("kshare_of_ideal")),
            fmt_num(r.get("native_rps")),
            fmt_pct(r.get("native_of_ideal")),
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
    return text + table(head, rows) + [""]


def plot(plt: Any, res: dict[str, Any]) -> Any:
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
    line_axis(ax, "consumers", "records/s while all are busy", "scaling with 5 ms of work per record", 7)
    groups = [f"{r['consumers']}/{r['partitions']}" for r in rows]
    bars(
        ax2,
        groups,
        {n: [100 * (r.get(f"{n}_of_ideal") or 0) for r in rows] for n in ("kshare", "native")},
        "% of the ideal rate",
    )
    ax2.axhline(100, color="black", lw=0.8, alpha=0.6)
    ax2.set_xlabel("consumers / partitions")
    ax2.set_title("share of the ideal N x 200 records/s", fontsize=10)
    return fig


SCENARIO = scenario(
    __name__, 'Scaling past partitions: 5 ms of work per record',
    max_repeats=1,  # long runs that alternate anyway
    needs=frozenset({UPSTREAM, KAFKA4}),
)
